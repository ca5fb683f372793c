"""The web page's rollouts: started in the background, their progress followed, the last N kept in memory."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal

from pydantic import BaseModel, Field

from opencode_env.wire.models import Phase, RolloutRequest, RolloutResult, RolloutStatus

log = logging.getLogger("opencode_env.viewer")
Progress = Callable[[Phase, str], Awaitable[None]]
Runner = Callable[[RolloutRequest, Progress], Awaitable[RolloutResult]]
"""Runs one rollout reporting its phases; the server passes its own, which goes through its concurrency cap."""
MAX_EVENTS = 200
MAX_MESSAGE_CHARS = 500


class RunsFull(Exception):
    """Every kept slot holds a rollout still running."""


class ProgressEvent(BaseModel):
    phase: Phase
    message: str
    at_s: float = Field(description="Seconds since the run started.")


class RunView(BaseModel):
    """What the page shows of one run (never the request's key, never the whole result)."""

    id: str
    task_id: str
    instruction_head: str
    state: Literal["running", "finished", "crashed"]
    phase: Phase | None = None
    message: str = ""
    events: list[ProgressEvent] = Field(default_factory=list)
    started_at: float
    wall_s: float | None = None
    status: RolloutStatus | None = None
    reward: float | None = None
    error: str | None = None


class _Run:
    def __init__(self, request: RolloutRequest) -> None:
        self.view = RunView(
            id=uuid.uuid4().hex[:12],
            task_id=request.task_id,
            instruction_head=request.instruction[:200],
            state="running",
            started_at=time.time(),
        )
        self.started = time.monotonic()
        self.result: RolloutResult | None = None
        self.task: asyncio.Task[None] | None = None

    async def progress(self, phase: Phase, message: str) -> None:
        view = self.view
        view.phase, view.message = phase, message[:MAX_MESSAGE_CHARS]
        view.events.append(ProgressEvent(phase=phase, message=view.message, at_s=round(self.elapsed(), 3)))
        del view.events[:-MAX_EVENTS]

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, result: RolloutResult) -> None:
        self.result = result
        view = self.view
        view.state, view.status, view.reward, view.error = "finished", result.status, result.reward, result.error
        view.wall_s = round(self.elapsed(), 3)

    def crash(self, error: BaseException) -> None:
        view = self.view
        view.state, view.error, view.wall_s = "crashed", f"{type(error).__name__}: {error}", round(self.elapsed(), 3)


class Runs:
    """At most `keep` runs, newest last; a new run evicts the oldest finished one, never a running one."""

    def __init__(self, runner: Runner, keep: int = 20) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._runner = runner
        self.keep = keep
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    def start(self, request: RolloutRequest) -> RunView:
        self._make_room()
        run = _Run(request)
        self._runs[run.view.id] = run
        run.task = asyncio.create_task(self._drive(run, request), name=f"web-rollout-{run.view.id}")
        return run.view

    def _make_room(self) -> None:
        while len(self._runs) >= self.keep:
            oldest = next((key for key, run in self._runs.items() if run.view.state != "running"), None)
            if oldest is None:
                raise RunsFull(f"{self.keep} rollouts are already running from this page; wait for one to end")
            del self._runs[oldest]

    async def _drive(self, run: _Run, request: RolloutRequest) -> None:
        try:
            run.finish(await self._runner(request, run.progress))
        except asyncio.CancelledError as cancelled:
            run.crash(cancelled)
            raise
        except Exception as error:
            log.exception("web rollout %s failed", run.view.id)
            run.crash(error)

    def views(self) -> list[RunView]:
        return [run.view for run in reversed(self._runs.values())]

    def view(self, run_id: str) -> RunView | None:
        run = self._runs.get(run_id)
        return run.view if run else None

    def result(self, run_id: str) -> RolloutResult | None:
        run = self._runs.get(run_id)
        return run.result if run else None

    async def cancel_all(self) -> None:
        tasks = [run.task for run in self._runs.values() if run.task is not None and not run.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
