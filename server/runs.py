"""Every rollout the server runs, as its /web page lists them: those running followed phase by phase (whichever
transport started them: the server's `Rollouts.run` records each one here), those finished kept in a results
directory that outlives the server (the newest N), or in memory when there is none."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import ValidationError

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
    "ResultsDir",
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
DEFAULT_RESULTS_KEEP = 200
RUN_ID = re.compile(r"^\d{8}-\d{6}-\d{6}-[0-9a-f]{6}$")
"""A run's id: its start (UTC, to the microsecond) then random hex, so that ids sort by age and name files safely."""
STALE_TEMP_S = 3600.0


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

    async def progress(self, phase: Phase, message: str) -> None:
        view = self.view
        view.phase, view.message = phase, message[:MAX_MESSAGE_CHARS]
        view.events.append(ProgressEvent(phase=phase, message=view.message, at_s=round(self.elapsed(), 3)))
        del view.events[:-MAX_EVENTS]

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, result: RolloutResult) -> None:
        self.result = _without_key(result)
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


def _without_key(result: RolloutResult) -> RolloutResult:
    """The pipeline's result never carries the key (its `task` is the request without it); a result made elsewhere
    is held to the same rule before it is kept or written."""
    if result.task is None or not result.task.api_key:
        return result
    return result.model_copy(update={"task": result.task.model_copy(update={"api_key": ""})})


class ResultsDir:
    """Finished runs on disk, for as long as they are among the newest `keep`: `<id>.json` (the RolloutResult, as
    `opencode-env view` opens it) and `<id>.run.json` (its row), each written whole (a temporary file renamed) and
    readable by this user only."""

    def __init__(self, path: Path, keep: int = DEFAULT_RESULTS_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.path, self.keep = path, keep
        path.mkdir(mode=0o700, parents=True, exist_ok=True)

    @classmethod
    def configured(cls, directory: str, keep: int) -> ResultsDir | None:
        """The results directory an operator set (OPENCODE_ENV_RESULTS_DIR; '' is the user's state directory),
        keeping `keep` results (0 keeps none on disk); None, with a warning, when it cannot be made."""
        if keep == 0:
            return None
        path = Path(directory).expanduser() if directory else default_results_dir()
        if not path.is_absolute():
            why = f"{directory!r} is not an absolute path" if directory else "this user has no home directory"
            log.warning("results are kept in memory only: %s; set %s", why, variable("results_dir"))
            return None
        try:
            return cls(path, keep)
        except OSError as error:
            log.warning(
                "results are kept in memory only: cannot make %s (%s); set %s", path, error, variable("results_dir")
            )
            return None

    def load(self, *, warn: bool = True) -> list[RunView]:
        """The rows of the newest `keep` results, oldest first; a file that is not one is skipped (and logged, with
        `warn`: at start, not on every look at what other servers saved)."""
        self._remove_stale_temporaries()
        views = []
        for run_id in self._ids()[-self.keep :]:
            try:
                view = RunView.model_validate_json(self._row(run_id).read_bytes())
            except (OSError, ValidationError) as error:
                if warn:
                    log.warning("skipping the saved run %s: %s", run_id, str(error)[:200])
                continue
            if view.id == run_id and (self.path / f"{run_id}.json").is_file():
                views.append(view)
        return sorted(views, key=lambda view: view.started_at)

    def save(self, view: RunView, result: RolloutResult) -> None:
        """The result, then its row (a row always has its result), then the oldest beyond `keep` removed."""
        _write_atomically(self.path / f"{view.id}.json", _without_key(result).model_dump_json().encode())
        _write_atomically(self._row(view.id), view.model_dump_json().encode())
        for run_id in self._ids()[: -self.keep]:
            for path in (self._row(run_id), self.path / f"{run_id}.json"):
                path.unlink(missing_ok=True)

    def read(self, run_id: str) -> bytes | None:
        if not RUN_ID.match(run_id):
            return None
        try:
            return (self.path / f"{run_id}.json").read_bytes()
        except FileNotFoundError:
            return None

    def _row(self, run_id: str) -> Path:
        return self.path / f"{run_id}.run.json"

    def _ids(self) -> list[str]:
        """Every saved run's id, oldest first (a result whose row was never written counts, so it is pruned too)."""
        with os.scandir(self.path) as entries:
            names = [entry.name for entry in entries if entry.is_file(follow_symlinks=False)]
        stems = {name.removesuffix(".json").removesuffix(".run") for name in names if name.endswith(".json")}
        return sorted(stem for stem in stems if RUN_ID.match(stem))

    def _remove_stale_temporaries(self) -> None:
        """What a server killed mid-write left (a live server's temporaries are younger)."""
        with os.scandir(self.path) as entries:
            stale = [
                entry.path
                for entry in entries
                if entry.name.startswith(".")
                and entry.name.endswith(".tmp")
                and time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S
            ]
        for path in stale:
            Path(path).unlink(missing_ok=True)


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def default_results_dir() -> Path:
    """The user's state directory's results (not absolute for a user without a home, e.g. a container's numeric
    uid: expanduser leaves "~" as it is)."""
    state = os.environ.get("XDG_STATE_HOME", "") or os.path.expanduser("~/.local/state")
    return Path(state) / "opencode-env" / "results"


Runner = Callable[[RolloutRequest, Run], Awaitable[RolloutResult]]
"""Runs one of the page's own rollouts, reporting into its `Run`; the server passes its own (`Rollouts.run_recorded`),
which goes through its concurrency cap."""


class Runs:
    """Every rollout of this server: the running ones, and the finished ones (the newest `results.keep` with a
    results directory, else the newest `keep` with their results in memory). `start` runs one for the page itself,
    at most `keep` of those at once.

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
        self._started_here: set[asyncio.Task[None]] = set()
        for view in results.load() if results is not None else []:
            if self.origin.ran(view):
                self._finished[view.id] = Run(view)

    @property
    def kept(self) -> int:
        """How many finished runs are listed."""
        return self.results.keep if self.results is not None else self.keep

    def begin(self, request: RolloutRequest, owner: str = OPERATOR.id) -> Run:
        """A rollout starts (any transport) for the caller `owner`: it is listed as running from now on, never
        refused."""
        run = Run.of(request, self.origin, owner)
        self._running[run.view.id] = run
        return run

    async def finish(self, run: Run, result: RolloutResult) -> None:
        """The rollout ended with `result` (a run already ended is left as it is): it moves to the finished ones,
        its result to the results directory; a directory that cannot take it leaves the result in memory."""
        if not run.running:
            return
        run.finish(result)
        self._settle(run)
        if self.results is None or run.result is None:
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
        while len(self._finished) > self.kept:
            self._finished.popitem(last=False)
        # Results a directory could not take stay in memory: the newest `keep` of them, like without a directory.
        in_memory = [kept for kept in self._finished.values() if kept.result is not None and kept is not run]
        for older in in_memory[: max(0, len(in_memory) - self.keep + 1)]:
            older.result = None

    def start(self, request: RolloutRequest, runner: Runner, caller: Caller = OPERATOR) -> RunView:
        """Run one of the page's own rollouts in the background, owned by `caller`; RunsFull when `keep` of them are
        running."""
        if len(self._started_here) >= self.keep:
            raise RunsFull(f"{self.keep} rollouts are already running from this page; wait for one to end")
        run = self.begin(request, caller.id)
        task = asyncio.create_task(self._drive(run, request, runner), name=f"web-rollout-{run.view.id}")
        self._started_here.add(task)
        task.add_done_callback(self._started_here.discard)
        return run.view

    async def _drive(self, run: Run, request: RolloutRequest, runner: Runner) -> None:
        try:
            await self.finish(run, await runner(request, run))
        except asyncio.CancelledError as cancelled:
            self.crash(run, cancelled)
            raise
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
        tasks = list(self._started_here)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
