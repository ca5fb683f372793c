"""The fault matrix: each fault gives its status, keeps every turn captured so far, and leaves nothing behind.

A fault runs on the E2B backend over the fake as well as on the local backend when the backend's own code handles it:
the capture proxy dying (the cloud proxy is a root background process the backend starts, watches and reads through
root commands), OpenCode attacked by its own tool (another uid than OpenCode's on every backend), a setup or
verify command that hangs (each backend's timeout and kill), a verify command's megabytes of output
and the agent's huge and binary files (each backend's output capture and file listing and reading). The model
endpoint's faults (unreachable, 500s, 429 with Retry-After, a stall before or mid stream) run on the local backend
only: the capture proxy meets them with the same code on every backend (the cloud backend uploads the same
`opencode_env.proxy` package), and the pipeline classifies the turns it records with the same code; what the cloud
backend adds around them (starting the proxy, reading its turns, running the agent's command) every E2B rollout here
and in test_cloud_backends.py runs, and a command's deadline on E2B is one code path for every identity
(`E2BSandbox._run_as`), which the hanging setup and verify commands below take.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import ProvidedTools, SandboxBackend
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, demo_script, fail, say, stall
from opencode_env.testing.fake_e2b import FakeCloud
from tests.conftest import e2b_over, processes_mentioning
from tests.helpers import Outcome, gone_after_its_probe, rollout, sleep_cmd
from tests.stub_server import wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["local", "e2b-fake"])
def any_backend(request: pytest.FixtureRequest, backend: LocalBackend, e2b_fake: E2BBackend) -> SandboxBackend:
    return backend if request.param == "local" else e2b_fake


def rollout_proxy_pids(sandbox_base: Path) -> list[str]:
    """Capture proxies of this test's rollouts: their command line or their cgroup names a sandbox under the base.
    The proxy itself only, a Python run as `-m opencode_env.proxy`: not the launchers around it on the fake cloud
    (nsenter, unshare, the shells, whose argv holds the proxy's command as one string), and not
    `python -m opencode_env.proxy.ping`, the backend's short-lived call to its admin."""
    rollouts = {path.name for path in sandbox_base.iterdir()}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cgroups = (proc / "cgroup").read_text()
        except OSError:
            continue
        if not Path(argv[0]).name.startswith("python") or not runs_module(argv, "opencode_env.proxy"):
            continue
        if any(str(sandbox_base) in arg for arg in argv) or any(f"/{name}\n" in cgroups for name in rollouts):
            found.append(proc.name)
    return found


def runs_module(argv: list[str], module: str) -> bool:
    return any(flag == "-m" and name == module for flag, name in pairwise(argv))


async def test_upstream_down_after_its_probe(backend: LocalBackend, no_leaks: None) -> None:
    """Down before the rollout starts is refused by the endpoint probe (tests/integration/test_endpoint_errors.py);
    down between the probe and the agent's first call is the proxy's to record."""
    request = await gone_after_its_probe(agent_timeout_s=60, verify=["true", "true"])
    result = await run_rollout(request, backend)
    assert (result.status, result.failed_phase) == ("upstream_error", "agent")
    assert result.proxy_turns
    assert {turn.outcome for turn in result.proxy_turns} == {"unreachable"}
    assert [r.exit_code for r in result.verify_results] == [0, 0]
    assert (result.reward, result.reward_source) == (None, "none")


async def test_upstream_500_forever(backend: LocalBackend, no_leaks: None) -> None:
    """The default threshold of server errors ends the agent, long before its deadline (a loaded machine's OpenCode
    can take most of 15 s to boot, so the deadline is far off: only the threshold can decide)."""
    outcome = await rollout(backend, Script(steps=[fail(500)] * 30), agent_timeout_s=180)
    result = outcome.result
    assert result.status == "upstream_error"
    assert len(result.proxy_turns) == len(outcome.exchanges) >= 1
    assert {(turn.upstream_status, turn.outcome) for turn in result.proxy_turns} == {(500, "upstream_error")}


async def test_upstream_429_with_retry_after_is_honoured(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, Script(steps=[fail(429, retry_after_s=1.5), say("done")]), verify=[])
    result = outcome.result
    assert result.status == "completed", result.error
    first, second = result.proxy_turns
    assert (first.upstream_status, second.outcome) == (429, "complete")
    assert second.timestamp - first.timestamp >= 1.4


async def test_upstream_hangs_before_the_first_byte(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, Script(steps=[stall(60), say("done")]), upstream_idle_timeout_s=2, verify=[])
    result = outcome.result
    assert result.status == "completed", result.error
    assert [turn.outcome for turn in result.proxy_turns] == ["stalled", "complete"]


async def test_upstream_hangs_mid_stream(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(
        backend, Script(steps=[stall(60, after_tokens=3), say("done")]), upstream_idle_timeout_s=2, verify=[]
    )
    result = outcome.result
    stalled = result.proxy_turns[0]
    assert (stalled.outcome, len(stalled.completion_token_ids)) == ("stalled", 3)
    assert stalled.completion_token_ids == [t.token_id for t in outcome.exchanges[0].tokens[:3]]
    assert result.status == "completed", result.error
    assert result.proxy_turns[-1].outcome == "complete"


PROXY_DEATH_AGENT_S = 150.0
"""The agent's budget in the proxy's death: enough for OpenCode to boot and make its second call on a loaded machine
(the wait for that call takes the same budget). The model stalls on that call past the budget: only the proxy's
death, seen by the pipeline, ends the agent."""


@pytest.mark.timeout(PROXY_DEATH_AGENT_S + 150)
async def test_the_proxy_dies_mid_rollout(any_backend: SandboxBackend, sandbox_base: Path, no_leaks: None) -> None:
    script = Script(steps=[bash("echo step one"), stall(PROXY_DEATH_AGENT_S + 60)])
    with ScriptedModelServer(script) as model:
        task = run_rollout(demo_request(model.base_url, agent_timeout_s=PROXY_DEATH_AGENT_S), any_backend)
        running = asyncio.ensure_future(task)
        try:
            await wait_until(lambda: len(model.exchanges) >= 2 or running.done(), PROXY_DEATH_AGENT_S)
            assert len(model.exchanges) >= 2, running.result().error if running.done() else "no second call in time"
            proxies = rollout_proxy_pids(sandbox_base)
            assert len(proxies) == 1, proxies
            os.kill(int(proxies[0]), signal.SIGKILL)
        finally:
            result = await running
    assert (result.status, result.failed_phase) == ("proxy_error", "agent")
    assert "the agent was stopped then" in (result.error or ""), "stopped once the proxy was gone, not by its deadline"
    assert result.proxy_turns[0].outcome == "complete"
    assert len(result.verify_results) == 2


async def test_opencode_crashes(any_backend: SandboxBackend, no_leaks: None) -> None:
    """Its own tool tries to kill OpenCode: on every backend the tools are another uid than OpenCode (on the clouds
    `user`, started by root's broker, its parent) and cannot signal it."""
    outcome = await rollout(any_backend, Script(steps=[bash("kill -9 $PPID")]))
    result = outcome.result
    assert (result.status, result.agent_exit_code) == ("completed", 0)
    assert "Operation not permitted" in json.dumps(outcome.exchanges[-1].request)


async def test_opencode_exits_0_without_doing_anything(sandbox_base: Path, no_leaks: None) -> None:
    async def silent_opencode() -> ProvidedTools:
        tools = await cached_tools()
        return ProvidedTools(opencode="/bin/true", opencode_version="1.18.33", python=tools.python, proxy_ready=True)

    result = (await rollout(LocalBackend(silent_opencode, base_dir=sandbox_base), demo_script())).result
    assert (result.status, result.failed_phase) == ("agent_error", "agent")
    assert "without calling the model" in (result.error or "")
    assert result.agent_exit_code == 0


async def test_a_setup_command_hangs(any_backend: SandboxBackend, no_leaks: None) -> None:
    outcome = await rollout(any_backend, demo_script(), setup=[sleep_cmd(300)], setup_timeout_s=1)
    result = outcome.result
    assert (result.status, result.failed_phase) == ("setup_failed", "setup")
    assert result.setup_results[0].timed_out
    assert outcome.exchanges == []
    assert processes_mentioning(sleep_cmd(300)) == []


async def test_a_verify_command_hangs(any_backend: SandboxBackend, no_leaks: None) -> None:
    script = Script(steps=[say("done")])
    result = (await rollout(any_backend, script, verify=[sleep_cmd(300), "true"], verify_timeout_s=1)).result
    assert result.status == "completed", result.error
    assert [(r.timed_out, r.exit_code) for r in result.verify_results] == [(True, None), (False, 0)]
    assert result.reward == 0.5
    assert processes_mentioning(sleep_cmd(300)) == []


@pytest.fixture(scope="module", params=["local", "e2b-fake"])
async def big_outputs(
    request: pytest.FixtureRequest,
    backend: LocalBackend,
    fake_cloud: FakeCloud,
    leak_check: Callable[[], None],
) -> Outcome:
    """One rollout per backend for both big outputs: the agent writes huge and binary files, then verify prints
    megabytes. They cannot mask each other: the files are the agent's, read from the work dir when the rollout is
    collected, and the printing is verify's, its output captured by the backend's command runner; each test reads
    only its own part of the result."""
    chosen: SandboxBackend = backend if request.param == "local" else e2b_over(fake_cloud)
    writes = bash(
        "head -c 3000000 /dev/urandom > big.bin && head -c 2000000 /dev/zero | tr '\\\\0' a > big.txt"
        " && echo small > small.txt"
    )
    prints = "head -c 20000000 /dev/zero | tr '\\\\0' x; echo tail-end"
    outcome = await rollout(chosen, Script(steps=[writes, say("done")]), verify=[prints])
    leak_check()
    return outcome


def test_a_verify_command_prints_megabytes(big_outputs: Outcome) -> None:
    result = big_outputs.result
    printed = result.verify_results[0]
    assert printed.output_truncated
    assert printed.stdout.endswith("tail-end\n")
    assert len(printed.stdout) < 300_000
    assert len(result.model_dump_json()) < 2_000_000


def test_the_agent_writes_huge_and_binary_files(big_outputs: Outcome) -> None:
    result = big_outputs.result
    assert result.status == "completed", result.error
    assert sorted(result.files_extra) == ["big.bin", "big.txt"]
    assert result.files["small.txt"] == "small\n"
    assert len(json.dumps(result.files)) < 100_000
