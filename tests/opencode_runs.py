"""A pytest plugin that counts the real OpenCode runs each test file starts (`-p tests.opencode_runs`):
the suite's time goes to them, so a change that cuts tests' time says how many it cut. A run is counted when the
agent phase starts OpenCode in a sandbox that runs it (not the stub backend's); it is charged to the test whose setup,
call or teardown started it (a shared fixture's run to the first test that asked for it). Under pytest-xdist each
worker hands its counts to the controller, which prints them all. Runs in another process (a server started as a
subprocess, an example script) are not seen."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from opencode_env.rollout import pipeline
from opencode_env.testing.stub_backend import StubSandbox

_counts: Counter[str] = Counter()
_current: list[str] = ["(outside any test)"]


def pytest_configure(config: pytest.Config) -> None:
    run_agent = pipeline.run_agent

    async def counted(rollout: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(rollout.sandbox, StubSandbox):
            _counts[_current[0]] += 1
        await run_agent(rollout, *args, **kwargs)

    pipeline.run_agent = counted  # type: ignore[assignment]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current[0] = "(outside any test)"


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["opencode_runs"] = dict(_counts)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    _counts.update(getattr(node, "workeroutput", {}).get("opencode_runs", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    by_file: Counter[str] = Counter()
    for nodeid, count in _counts.items():
        by_file[nodeid.split("::")[0]] += count
    terminalreporter.section("real OpenCode runs")
    for nodeid, count in sorted(_counts.items()):
        terminalreporter.write_line(f"{count:3d}  {nodeid}")
    for path, count in sorted(by_file.items()):
        terminalreporter.write_line(f"{count:3d}  total {path}")
    terminalreporter.write_line(f"{sum(_counts.values()):3d}  total")
