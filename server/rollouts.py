"""The rollouts this server runs: one concurrency cap over every transport, cancellation, and shutdown.

Every transport (`/mcp`, `/mcp/stream`, `/ws`, `/step`, stdio) reaches the pipeline through `Rollouts.run`, so the
cap (MAX_CONCURRENT_ENVS) holds whichever way a call arrives; a call beyond the cap waits for a slot, its caller's
fair turn (`server.fair_slots`), and the wait counts against its own deadline. A call past its caller's share of
waiting calls is refused at once (`OverShare`, raised to the transport) and recorded nowhere. Each rollout runs in a
task of its own, so that:
- a caller's cancellation (`notifications/cancelled`, a closed connection) cancels it and returns only once its
  sandbox is closed;
- at shutdown the server cancels it and still answers the caller, with the partial result (status `cancelled`).

Given a `Runs` (the server's /web list), `Rollouts.run` records every rollout there too: its start, each phase, and
how it ended (a rollout its caller cancelled included, with what it had done).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.upstream_policy import UpstreamPolicy
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.server.fair_slots import FairSlots, OverShare, Ticket
from opencode_env.server.runs import Run, Runs
from opencode_env.settings import Settings
from opencode_env.viewer.rows import OPERATOR
from opencode_env.wire import Phase, RolloutRequest, RolloutResult, total_budget_s

log = logging.getLogger("opencode_env.server")
Progress = Callable[[Phase, str], Awaitable[None]]
CANCEL_GRACE_S = 30.0
SHUTDOWN_MESSAGE = "the server is shutting down: the rollout was cancelled"
CALLER_CANCELLED_MESSAGE = "its caller cancelled the rollout"


class Rollouts:
    def __init__(
        self,
        backend: SandboxBackend,
        limit: int,
        upstream_policy: UpstreamPolicy | None = None,
        runs: Runs | None = None,
        settings: Settings | None = None,
        *,
        per_caller: int = 0,
        queued_per_caller: int | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"MAX_CONCURRENT_ENVS must be at least 1, got {limit}")
        self.backend = backend
        self.limit = limit
        self.upstream_policy = upstream_policy
        """Where a caller's base_url may point (the server's settings); None checks nothing (the library's own use)."""
        self.slots = FairSlots(limit, per_caller=per_caller, queued_per_caller=queued_per_caller)
        self._running: set[asyncio.Task[RolloutResult]] = set()
        self._calls: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        self.runs = runs
        """Where every rollout is recorded (the server's /web list); None records nothing."""
        self.settings = settings
        """The server's settings, for every rollout (None: each rollout reads this process's environment)."""

    @property
    def shutting_down(self) -> bool:
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def run(
        self,
        request: RolloutRequest,
        progress: Progress | None = None,
        *,
        record: Run | None = None,
        owner: str = OPERATOR.id,
    ) -> RolloutResult:
        """Run one rollout within the cap; cancelling the caller cancels it and waits for its sandbox to close. It is
        recorded in `runs` (when there is one): as `record` when the /web page already lists it, else as a new run
        owned by the caller `owner` (the only caller but the operator who sees it there). OverShare, before anything
        is recorded, when `owner` already has its share of calls waiting."""
        runs = self.runs
        if record is not None:
            owner = record.view.owner
        try:
            ticket = self.slots.enter(owner, capped=owner != OPERATOR.id)
        except OverShare:
            if runs is not None and record is not None:
                runs.discard(record)
            raise
        try:
            return await self._recorded(request, progress, record, owner, ticket)
        finally:
            # A rollout that started gives its slot back once it has ended (its sandbox closed), not when its caller
            # stops waiting for it.
            if not ticket.handed_on:
                ticket.leave()

    async def _recorded(
        self, request: RolloutRequest, progress: Progress | None, record: Run | None, owner: str, ticket: Ticket
    ) -> RolloutResult:
        runs = self.runs
        if runs is not None and record is None:
            record = runs.begin(request, owner)
        tracker = _PhaseTracker(progress, record)
        started = time.monotonic()
        if runs is None or record is None:
            return _logged(await self._run(request, tracker, started, ticket))
        try:
            result = await self._run(request, tracker, started, ticket)
        except asyncio.CancelledError:
            cut = tracker.cut_short(request, self.backend.name, started, CALLER_CANCELLED_MESSAGE)
            await asyncio.shield(runs.finish(record, cut))
            raise
        except Exception as error:
            runs.crash(record, error)
            raise
        await runs.finish(record, result)
        return _logged(result)

    def check_room(self, owner: str) -> None:
        """OverShare when a call of `owner` would be refused now for its caller's share of waiting calls."""
        if owner != OPERATOR.id:
            self.slots.check_room(owner)

    async def run_recorded(self, request: RolloutRequest, record: Run) -> RolloutResult:
        """A rollout the /web page started and already lists as `record`."""
        return await self.run(request, record=record)

    async def _run(
        self, request: RolloutRequest, tracker: _PhaseTracker, started: float, ticket: Ticket
    ) -> RolloutResult:
        if self._stopping.is_set():
            return _cancelled(request, self.backend.name, tracker.phase, started, SHUTDOWN_MESSAGE)
        # Only a backend's own verdict stops a rollout here; the cheap checks /metadata shows may not know every way
        # a backend can be configured.
        verdict = self.backend.preflight_verdict()
        problem = verdict.problem if verdict.proven else None
        if problem:
            result = _failed(request, self.backend.name, started, "sandbox_error", problem)
            result.failed_phase = "sandbox"
            return result
        rollout = asyncio.ensure_future(self._within_cap(request, tracker, ticket))
        self._running.add(rollout)
        rollout.add_done_callback(self._running.discard)
        call = asyncio.current_task()
        if call is not None:
            self._calls.add(call)
        try:
            return await asyncio.shield(rollout)
        except asyncio.CancelledError:
            if call is not None and call.cancelling():
                await self._stop(rollout, request)
                raise
            if not (rollout.cancelled() and self._stopping.is_set()):
                raise
            log.info("rollout %s cancelled at shutdown in phase %s", request.task_id or "-", tracker.phase or "-")
            return tracker.cut_short(request, self.backend.name, started, SHUTDOWN_MESSAGE)
        finally:
            if call is not None:
                self._calls.discard(call)

    async def _within_cap(self, request: RolloutRequest, tracker: _PhaseTracker, ticket: Ticket) -> RolloutResult:
        started = time.monotonic()
        budget = total_budget_s(request)
        ticket.handed_on = True
        try:
            try:
                await asyncio.wait_for(ticket.acquire(), timeout=budget)
            except TimeoutError:
                message = (
                    f"no rollout slot freed within the deadline ({self.limit} rollouts run at once on this server)"
                )
                return _failed(request, self.backend.name, started, "timeout", message)
            waited = time.monotonic() - started
            if waited >= 0.5:
                log.info("rollout %s waited %.1fs for a slot", request.task_id or "-", waited)
                request = request.model_copy(update={"total_timeout_s": max(1.0, budget - waited)})
            return await run_rollout(
                request,
                self.backend,
                progress=tracker,
                result=tracker.partial,
                upstream_policy=self.upstream_policy,
                settings=self.settings,
            )
        finally:
            ticket.leave()

    async def _stop(self, rollout: asyncio.Task[RolloutResult], request: RolloutRequest) -> None:
        """Cancel the rollout and wait (as long as the caller's own cancellation lets us) for its sandbox to close."""
        label = request.task_id or "-"
        log.info("rollout %s cancelled by its caller; closing its sandbox", label)
        rollout.add_done_callback(
            lambda _: log.info("rollout %s cancelled by its caller: its sandbox is closed", label)
        )
        rollout.cancel()
        await asyncio.wait({rollout}, timeout=CANCEL_GRACE_S)

    async def shut_down(self, timeout_s: float = CANCEL_GRACE_S) -> None:
        """Cancel every rollout and wait until each caller has its partial result (or the timeout passes)."""
        self._stopping.set()
        rollouts, calls = list(self._running), list(self._calls)
        if rollouts:
            log.info("shutting down: cancelling %d rollout(s) in flight", len(rollouts))
        for rollout in rollouts:
            rollout.cancel()
        if calls:
            await asyncio.wait(calls, timeout=timeout_s)


class _PhaseTracker:
    """Passes progress on (to the caller and the run's record), and remembers the phase reached, for the result of
    a rollout cut short."""

    def __init__(self, progress: Progress | None, record: Run | None = None) -> None:
        self._progress = progress
        self._record = record
        self.phase: Phase | None = None
        self.partial: RolloutResult = RolloutResult()

    def cut_short(self, request: RolloutRequest, backend: str, started: float, why: str) -> RolloutResult:
        """The rollout's own record of what it did before it was cut (setup results, timings, ...)."""
        if self.partial.status != "cancelled":
            return _cancelled(request, backend, self.phase, started, why)
        self.partial.error = f"{why} ({self.partial.error})"
        self.partial.failed_phase = self.partial.failed_phase or self.phase
        return self.partial

    async def __call__(self, phase: Phase, message: str) -> None:
        self.phase = phase
        if self._record is not None:
            await self._record.progress(phase, message)
        if self._progress is not None:
            await self._progress(phase, message)


def _logged(result: RolloutResult) -> RolloutResult:
    log.info(
        "rollout %s %s: %s reward=%s in %.1fs",
        result.task_id or "-",
        result.sandbox_id,
        result.status,
        result.reward,
        result.wall_s,
    )
    return result


def _failed(request: RolloutRequest, backend: str, started: float, status: Any, message: str) -> RolloutResult:
    return RolloutResult(
        task_id=request.task_id,
        mode=request.mode,
        backend=backend,
        status=status,
        error=message,
        wall_s=round(time.monotonic() - started, 4),
    )


def _cancelled(
    request: RolloutRequest, backend: str, phase: Phase | None, started: float, message: str
) -> RolloutResult:
    result = _failed(request, backend, started, "cancelled", message)
    result.failed_phase = phase
    return result
