"""A real server whose rollouts are a stand-in: each call is answered with a recorded result of a real demo rollout
(`tests/fixtures/result_v0_demo.json`: completed, reward 1.0, three aligned turns), after a wait the test chooses.

For the tests of a client's path (the transport, the client's timeouts, the answer parsed back whole), where a real
OpenCode run would cost seconds of CPU and prove nothing more: each client family still has one test that runs a
real rollout end to end (tests/integration/test_server.py says which)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.app import create_app
from opencode_env.server.rollouts import Progress, Rollouts
from opencode_env.server.tool import build_mcp
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.server_app import runtime_for

RECORDED = Path(__file__).parent / "fixtures" / "result_v0_demo.json"


def recorded_result() -> RolloutResult:
    return RolloutResult.model_validate_json(RECORDED.read_bytes())


class StandInRollouts(Rollouts):
    """Answers every call with `result` (its task id the caller's) after `seconds`, keeping each request it got and
    the most calls it ever had in flight at once."""

    def __init__(self, result: RolloutResult, seconds: float = 0.0) -> None:
        super().__init__(StubBackend(command_s=0), 4)
        self.result = result
        self.seconds = seconds
        self.requests: list[RolloutRequest] = []
        self.in_flight_now = 0
        self.peak = 0

    async def run(
        self, request: RolloutRequest, progress: Progress | None = None, *, record: Any = None, owner: str = ""
    ) -> Any:
        self.requests.append(request)
        self.in_flight_now += 1
        self.peak = max(self.peak, self.in_flight_now)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.in_flight_now -= 1
        return self.result.model_copy(update={"task_id": request.task_id or self.result.task_id})


@contextmanager
def stand_in_server(rollouts: Rollouts, token: str = "") -> Iterator[str]:
    """The app as `server.app` serves it (every transport, the results store; loopback-only access, or `token`'s),
    with `rollouts` answering the tool; yields its URL."""
    runtime = runtime_for(StubBackend(command_s=0), token=token)
    runtime.rollouts = rollouts
    runtime.mcp = build_mcp(runtime.rollouts, runtime.results)
    server = ThreadedServer(create_app(runtime))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
