"""Every rollout the server runs, as its /web page lists them: those running followed phase by phase (whichever
transport started them: the server's `Rollouts.run` records each one here), those finished kept in a results
directory that outlives the server (the newest N of each caller), or in memory when there is none.

Retention is per caller, so that no caller's rollouts push another's results out; and a rollout refused before it
had a sandbox (a base_url not allowed, a backend that cannot run, a slot never freed) is never written to the
directory and never counts against its caller's results: its row is listed among the newest REFUSED_KEPT of that
caller's refusals, in memory only."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from opencode_env.server.fair_slots import OverShare
from opencode_env.server.result_store import ResultsDir, without_key
from opencode_env.settings import variable
from opencode_env.viewer.rows import (
    OPERATOR,
    Caller,
    OtherServers,
    ProgressEvent,
    RunsFull,
    RunView,
    ServerOrigin,
)
from opencode_env.wire import Phase, RolloutRequest, RolloutResult

__all__ = [
    "OtherServers",
    "ProgressEvent",
    "Run",
    "RunView",
    "Runner",
    "Runs",
    "RunsFull",
    "ServerOrigin",
]

log = logging.getLogger("opencode_env.server")
MAX_EVENTS = 200
MAX_MESSAGE_CHARS = 500
REFUSED_KEPT = 20


class Run:
    """One rollout being recorded: its row, and its result until the results directory holds it."""

    def __init__(self, view: RunView) -> None:
        self.view = view
        self.started = time.monotonic() - (view.wall_s or 0.0)
        self.result: RolloutResult | None = None

    @classmethod
    def of(cls, request: RolloutRequest, server: ServerOrigin | None = None, owner: str = OPERATOR.id) -> Run:
        now = time.time()
        micros = int(now * 1_000_000) % 1_000_000
        run_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{micros:06d}-{uuid.uuid4().hex[:6]}"
        head = request.instruction[:200]
        view = RunView(
            id=run_id,
            task_id=request.task_id,
            instruction_head=head,
            state="running",
            started_at=now,
            server=server,
            owner=owner,
        )
        return cls(view)

    @property
    def running(self) -> bool:
        return self.view.state == "running"

    @property
    def refused(self) -> bool:
        """It failed before it had a sandbox: nothing of the task ran."""
        result = self.result
        return result is not None and not result.sandbox_id and result.status != "completed" and not self.running

    @property
    def kind(self) -> tuple[str, bool]:
        """What it is kept among: its caller's results, or its caller's refusals."""
        return (self.view.owner, self.refused)

    async def progress(self, phase: Phase, message: str) -> None:
        view = self.view
        view.phase, view.message = phase, message[:MAX_MESSAGE_CHARS]
        view.events.append(ProgressEvent(phase=phase, message=view.message, at_s=round(self.elapsed(), 3)))
        del view.events[:-MAX_EVENTS]

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, result: RolloutResult) -> None:
        self.result = without_key(result)
        view = self.view
        view.state, view.status, view.reward, view.error = "finished", result.status, result.reward, result.error
        view.failed_phase = result.failed_phase
        view.phase = result.failed_phase or view.phase
        view.message = _ending(result)
        view.wall_s = round(self.elapsed(), 3)
        view.events = _last_of_each_phase(view.events)

    def crash(self, error: BaseException) -> None:
        view = self.view
        view.state, view.error, view.wall_s = "crashed", f"{type(error).__name__}: {error}", round(self.elapsed(), 3)
        view.message = "the server failed running it"


def _ending(result: RolloutResult) -> str:
    reward = "" if result.reward is None else f", reward {result.reward}"
    where = f" in {result.failed_phase}" if result.failed_phase else ""
    return f"{result.status}{where}{reward} after {result.wall_s:.1f}s"


def _last_of_each_phase(events: list[ProgressEvent]) -> list[ProgressEvent]:
    """A finished run's timeline, one event per phase: the rows stay small however chatty the agent was."""
    last = {event.phase: event for event in events}
    return sorted(last.values(), key=lambda event: event.at_s)


Runner = Callable[[RolloutRequest, Run], Awaitable[RolloutResult]]
"""Runs one of the page's own rollouts, reporting into its `Run`; the server passes its own (`Rollouts.run_recorded`),
which goes through its concurrency cap."""


class Runs:
    """Every rollout of this server: the running ones, and the finished ones (each caller's newest `results.keep`
    with a results directory, else its newest `keep` with their results in memory; and each caller's newest
    REFUSED_KEPT refusals). `start` runs one for the page itself, at most `keep` of those at once per caller.

    A results directory is shared by every server of one user: each row names the server that ran it (`origin`,
    stamped here), and a server lists only its own rows and those of earlier servers at its address (itself,
    restarted); the others it counts (`others`) and never serves."""

    def __init__(self, keep: int = 20, results: ResultsDir | None = None, origin: ServerOrigin | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self.results = results
        self.origin = origin or ServerOrigin.this_process(address="")
        self._running: dict[str, Run] = {}
        self._finished: OrderedDict[str, Run] = OrderedDict()
        self._started_here: dict[str, set[asyncio.Task[None]]] = {}
        for view in results.load() if results is not None else []:
            if self.origin.ran(view):
                self._finished[view.id] = Run(view)

    @property
    def kept(self) -> int:
        """How many finished runs of each caller are listed."""
        return self.results.keep if self.results is not None else self.keep

    def begin(self, request: RolloutRequest, owner: str = OPERATOR.id) -> Run:
        """A rollout starts (any transport) for the caller `owner`: it is listed as running from now on, never
        refused."""
        run = Run.of(request, self.origin, owner)
        self._running[run.view.id] = run
        return run

    def discard(self, run: Run) -> None:
        """A run refused before it began (its caller was over its share): listed no more, kept nowhere."""
        if run.running:
            self._running.pop(run.view.id, None)
            run.view.state = "crashed"

    async def finish(self, run: Run, result: RolloutResult) -> None:
        """The rollout ended with `result` (a run already ended is left as it is): it moves to the finished ones,
        its result to the results directory (a refusal's stays in memory); a directory that cannot take it leaves
        the result in memory."""
        if not run.running:
            return
        run.finish(result)
        self._settle(run)
        if self.results is None or run.result is None or run.refused:
            return
        try:
            await asyncio.to_thread(self.results.save, run.view, run.result)
        except OSError as error:
            log.warning("run %s: its result stays in memory only: %s", run.view.id, error)
            return
        run.result = None

    def crash(self, run: Run, error: BaseException) -> None:
        if run.running:
            run.crash(error)
            self._settle(run)

    def _settle(self, run: Run) -> None:
        self._running.pop(run.view.id, None)
        self._finished[run.view.id] = run
        limit = REFUSED_KEPT if run.refused else self.kept
        alike = [kept for kept in self._finished.values() if kept.kind == run.kind]
        for older in alike[: max(0, len(alike) - limit)]:
            del self._finished[older.view.id]
        if run.refused:
            return
        # Results a directory could not take stay in memory: the newest `keep` of the caller's, like without one.
        in_memory = [
            kept
            for kept in self._finished.values()
            if kept.result is not None and kept is not run and kept.kind == run.kind
        ]
        for older in in_memory[: max(0, len(in_memory) - self.keep + 1)]:
            older.result = None

    def start(self, request: RolloutRequest, runner: Runner, caller: Caller = OPERATOR) -> RunView:
        """Run one of the page's own rollouts in the background, owned by `caller`; RunsFull when `keep` of the
        caller's are running."""
        started = self._started_here.setdefault(caller.id, set())
        if len(started) >= self.keep:
            raise RunsFull(
                f"{self.keep} rollouts are already running from this page for this caller "
                f"({variable('web_results')}); wait for one to end"
            )
        run = self.begin(request, caller.id)
        task = asyncio.create_task(self._drive(run, request, runner), name=f"web-rollout-{run.view.id}")
        started.add(task)
        task.add_done_callback(started.discard)
        return run.view

    async def _drive(self, run: Run, request: RolloutRequest, runner: Runner) -> None:
        try:
            await self.finish(run, await runner(request, run))
        except asyncio.CancelledError as cancelled:
            self.crash(run, cancelled)
            raise
        except OverShare as over:
            log.info("web rollout %s refused: %s", run.view.id, over)
        except Exception as error:
            log.exception("web rollout %s failed", run.view.id)
            self.crash(run, error)

    async def others(self) -> OtherServers:
        """The rows of the results directory this server does not list (read now: other servers keep writing)."""
        others = OtherServers()
        if self.results is None:
            return others
        try:
            views = await asyncio.to_thread(functools.partial(self.results.load, warn=False))
        except OSError as error:
            log.warning("cannot read the results directory %s: %s", self.results.path, error)
            return others
        for view in views:
            if self.origin.ran(view):
                continue
            others.rows += 1
            if view.server is None:
                others.unknown += 1
            else:
                others.addresses[view.server.address] = others.addresses.get(view.server.address, 0) + 1
        return others

    def views(self, caller: Caller = OPERATOR) -> list[RunView]:
        """The runs `caller` may see (its own; every one for the operator), newest first."""
        runs = [*self._running.values(), *self._finished.values()]
        views = (run.view for run in runs if caller.may_see(run.view))
        return sorted(views, key=lambda view: view.started_at, reverse=True)

    def view(self, run_id: str, caller: Caller = OPERATOR) -> RunView | None:
        """The run `run_id` if `caller` may see it; None for another caller's (as for an unknown id)."""
        run = self._running.get(run_id) or self._finished.get(run_id)
        return run.view if run and caller.may_see(run.view) else None

    async def result_json(self, run_id: str, caller: Caller = OPERATOR) -> bytes | None:
        """A finished run's result as JSON (from memory or the results directory), if `caller` may see it; None for
        any other id."""
        run = self._finished.get(run_id)
        if run is None or run.view.state != "finished" or not caller.may_see(run.view):
            return None
        if run.result is not None:
            return (await asyncio.to_thread(run.result.model_dump_json)).encode()
        if self.results is None:
            return None
        return await asyncio.to_thread(self.results.read, run_id)

    async def cancel_all(self) -> None:
        tasks = [task for started in self._started_here.values() for task in started]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
