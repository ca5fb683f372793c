"""A real server on loopback whose sandboxes only sleep (the stub backend), counting how many are open at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.testing.stub_backend import StubBackend, StubSandbox
from tests.helpers import idle_model_url
from tests.server_app import app_for


class CountingBackend(StubBackend):
    """The stub backend, remembering the rollouts it started (their agents' boxes: each also opens a grader's box)
    and the most of them it ever had open at once."""

    def __init__(self, *, command_s: float) -> None:
        super().__init__(command_s=command_s)
        self.peak = 0
        self.created = 0
        self.graders_boxes = 0
        self._agents: set[str] = set()

    async def create(self, spec: SandboxSpec) -> StubSandbox:
        sandbox = await super().create(spec)
        if spec.grader_box == "this":
            self.graders_boxes += 1
            return sandbox
        self.created += 1
        self._agents.add(sandbox.sandbox_id)
        self.peak = max(self.peak, len(self._agents & set(self.alive)))
        return sandbox


@dataclass
class StubServer:
    url: str
    backend: CountingBackend


@contextmanager
def stub_server(*, command_s: float, max_rollouts: int = 4, token: str | None = "") -> Iterator[StubServer]:
    backend = CountingBackend(command_s=command_s)
    server = ThreadedServer(app_for(backend, max_rollouts=max_rollouts, token=token))
    server.start()
    try:
        yield StubServer(server.url, backend)
    finally:
        server.stop()


def stub_arguments(task_id: str = "") -> dict[str, Any]:
    """A request the stub runs: one setup command (which sleeps), then an agent that exits without a model."""
    return {
        "instruction": "x",
        "base_url": idle_model_url(),
        "model": "m",
        "mode": "black_box",
        "setup": ["sleep"],
        "task_id": task_id,
    }


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()
