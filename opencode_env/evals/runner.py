"""Run an eval: every task k times, at most `concurrency` rollouts at once, on a runner (wire/runner.py: in this
process, on a server, on a Ray cluster); each result is written as soon as it finishes, so a rerun into the same
directory resumes where the last one stopped.

    DIR/eval.json                 the run's configuration; a rerun with another k or model is refused unless forced
    DIR/results/<task>/<n>.json   attempt n's RolloutResult (written to a temporary file, then renamed)
    DIR/results/<task>/<n>.html   its viewer page
    DIR/summary.json              the EvalSummary
    DIR/index.html                the summary table, linking every attempt's page
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel, Field, ValidationError

from opencode_env.evals.index_page import render_index
from opencode_env.evals.summary import AttemptOutcome, EvalSummary, summarize
from opencode_env.rollout.in_process import InProcess
from opencode_env.viewer.page import render_page
from opencode_env.wire import RolloutRequest, RolloutResult, Runner

Report = Callable[[str], None]
RunOne = Callable[[RolloutRequest, RolloutResult], Awaitable[RolloutResult]]
"""Runs one attempt; an in-process one fills the result it is given as it goes (what a cancelled attempt keeps)."""
P = ParamSpec("P")
T = TypeVar("T")

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._@+-]")
_ERROR_CHARS = 160


class EvalError(Exception):
    """A problem with an eval's tasks, directory or server, said to the user; nothing has run when it is raised."""


def safe_task_id(task_id: str) -> str:
    """The directory name of a task's results: the id itself when it is a plain file name, else its safe characters
    and a hash of the whole id (so that ids differing only in unsafe characters keep apart)."""
    safe = _UNSAFE_NAME.sub("_", task_id).lstrip(".")
    if safe and safe == task_id:
        return safe
    return f"{safe or 'task'}-{hashlib.sha256(task_id.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class EvalLayout:
    """Where an eval directory keeps each thing."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "eval.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def index(self) -> Path:
        return self.root / "index.html"

    def href(self, task_id: str, attempt: int) -> str:
        """Attempt `attempt`'s page, relative to the root (as index.html links it)."""
        return f"results/{safe_task_id(task_id)}/{attempt}.html"

    def attempt_json(self, task_id: str, attempt: int) -> Path:
        return self.root / "results" / safe_task_id(task_id) / f"{attempt}.json"

    def attempt_html(self, task_id: str, attempt: int) -> Path:
        return self.root / self.href(task_id, attempt)

    def attempt_cancelled(self, task_id: str, attempt: int) -> Path:
        """An attempt an ending cut short; never read back as a result, so a rerun runs the attempt again."""
        return self.root / "results" / safe_task_id(task_id) / f"{attempt}.cancelled.json"


class EvalConfig(BaseModel):
    """DIR/eval.json: what the results in the directory were run with."""

    k: int
    model: str = Field(description="The model of the tasks' requests ('(oracle)' for solution runs).")
    threshold: float
    inputs: list[str] = Field(default_factory=list, description="The task files and directories, as given.")
    tasks: list[str] = Field(default_factory=list, description="The task ids.")
    runs_on: str = Field("", description="The backend or server the attempts ran on.")


def describe_model(tasks: Sequence[RolloutRequest]) -> str:
    """The models the tasks name, as one string (an empty model is the endpoint's default)."""
    names = {
        "(oracle)" if task.solution is not None else task.model or f"({task.endpoint or 'default'} endpoint's model)"
        for task in tasks
    }
    return ", ".join(sorted(names))


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader (or a resumed run) sees
    the whole file or none."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _require_distinct(tasks: Sequence[RolloutRequest]) -> None:
    repeated = [task_id for task_id, count in Counter(task.task_id for task in tasks).items() if count > 1]
    if repeated:
        raise EvalError(f"task id {repeated[0]!r} appears more than once: task ids name the result directories")
    directories: dict[str, str] = {}
    for task in tasks:
        other = directories.setdefault(safe_task_id(task.task_id), task.task_id)
        if other != task.task_id:
            raise EvalError(f"task ids {other!r} and {task.task_id!r} share the directory {safe_task_id(other)!r}")


def _check_config(layout: EvalLayout, config: EvalConfig, *, force: bool) -> None:
    """Refuse to mix results of another k or model into a directory, unless forced."""
    if force or not layout.config.exists():
        return
    try:
        earlier = EvalConfig.model_validate_json(layout.config.read_bytes())
    except ValidationError as error:
        raise EvalError(
            f"{layout.config} is not an eval configuration ({error.errors()[0]['msg']}): choose another directory, "
            "or --force (force=True) to overwrite it"
        ) from error
    if (earlier.k, earlier.model) != (config.k, config.model):
        raise EvalError(
            f"{layout.root} holds an eval with k={earlier.k} and model {earlier.model!r}; this run asks for "
            f"k={config.k} and model {config.model!r}. Choose another directory, or --force (force=True) to resume "
            "into it anyway"
        )


@dataclass(frozen=True)
class Attempt:
    request: RolloutRequest
    number: int

    @property
    def key(self) -> tuple[str, int]:
        return self.request.task_id, self.number


@dataclass
class Plan:
    pending: list[Attempt] = field(default_factory=list)
    kept: dict[tuple[str, int], AttemptOutcome] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _saved_outcome(path: Path, number: int, notes: list[str]) -> AttemptOutcome | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return AttemptOutcome.of(RolloutResult.model_validate_json(raw), number)
    except ValidationError:
        notes.append(f"{path} is not a RolloutResult: running that attempt again")
        return None


def plan_attempts(tasks: Sequence[RolloutRequest], k: int, layout: EvalLayout, *, retry_infra: bool) -> Plan:
    """Which attempts to run (attempt 1 of every task first, then attempt 2...) and which saved ones to keep."""
    plan = Plan()
    for number in range(1, k + 1):
        for task in tasks:
            attempt = Attempt(task, number)
            saved = _saved_outcome(layout.attempt_json(task.task_id, number), number, plan.notes)
            if saved is None or (retry_infra and not saved.scored):
                plan.pending.append(attempt)
            else:
                plan.kept[attempt.key] = saved
    return plan


def _start_line(plan: Plan, total: int) -> str:
    line = f"attempts: {total} in all, {len(plan.kept)} done already (skipped), {len(plan.pending)} to run"
    infra = sum(not outcome.scored for outcome in plan.kept.values())
    if infra:
        line += f"; {infra} of those kept failed on our side (--retry-infra runs them again)"
    return line


def _progress_line(attempt: Attempt, result: RolloutResult, done: int, total: int, seconds: float) -> str:
    line = f"[{done}/{total}] {attempt.request.task_id} attempt {attempt.number}: {result.status}"
    line += f", reward {result.reward}, {seconds:.1f}s"
    first_line = (result.error or "").strip().partition("\n")[0]
    if first_line:
        line += f" ({first_line[:_ERROR_CHARS]})"
    return line


def _without_key(result: RolloutResult) -> RolloutResult:
    """Results carry no key already; a result from another server is not trusted to have dropped it."""
    if result.task is None or not result.task.api_key:
        return result
    return result.model_copy(update={"task": result.task.model_copy(update={"api_key": ""})})


def write_attempt(layout: EvalLayout, attempt: Attempt, result: RolloutResult) -> None:
    """The page first, then the JSON: a result file that exists always has its page."""
    json_path = layout.attempt_json(*attempt.key)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(layout.attempt_html(*attempt.key), render_page(result))
    write_atomically(json_path, result.model_dump_json())
    layout.attempt_cancelled(*attempt.key).unlink(missing_ok=True)


def write_cut_short(layout: EvalLayout, attempt: Attempt, partial: RolloutResult) -> None:
    """An attempt the eval's ending cut short: what it captured, beside the attempt's place (a rerun runs it again).
    Written at once, on the cancelled path: the cancellation is what this write answers."""
    partial.status = "cancelled"
    partial.error = partial.error or "the eval was ended before this attempt finished"
    path = layout.attempt_cancelled(*attempt.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, _without_key(partial).model_dump_json())


async def _run_pending(
    pending: Sequence[Attempt], run_one: RunOne, layout: EvalLayout, concurrency: int, report: Report
) -> dict[tuple[str, int], AttemptOutcome]:
    queue, finished = deque(pending), {}

    async def worker() -> None:
        while queue:
            attempt = queue.popleft()
            started = time.monotonic()
            partial = RolloutResult(task_id=attempt.request.task_id)
            try:
                result = _without_key(await run_one(attempt.request, partial))
            except asyncio.CancelledError:
                write_cut_short(layout, attempt, partial)
                raise
            await asyncio.to_thread(write_attempt, layout, attempt, result)
            finished[attempt.key] = AttemptOutcome.of(result, attempt.number)
            report(_progress_line(attempt, result, len(finished), len(pending), time.monotonic() - started))

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, len(pending))):
            group.create_task(worker())
    return finished


def _failed_to_reach(request: RolloutRequest, error: Exception) -> RolloutResult:
    return RolloutResult(
        task_id=request.task_id,
        mode=request.mode,
        status="internal_error",
        error=f"{type(error).__name__}: {error}",
        task=request.model_copy(update={"api_key": ""}),
    )


def _on(runner: Runner) -> RunOne:
    """The partial result an ending writes holds the request; a runner running the pipeline here fills in the rest
    as it goes. A runner that cannot be reached fails this attempt alone (a server restarting mid-eval)."""

    async def run_one(request: RolloutRequest, partial: RolloutResult) -> RolloutResult:
        partial.task = request.model_copy(update={"api_key": ""})
        try:
            return await runner.run_rollout(request, partial=partial)
        except (RuntimeError, OSError, TimeoutError, ValueError) as error:
            return _failed_to_reach(request, error)

    return run_one


def _outcomes_by_task(
    tasks: Sequence[RolloutRequest], k: int, outcomes: dict[tuple[str, int], AttemptOutcome]
) -> dict[str, list[AttemptOutcome]]:
    return {
        task.task_id: [outcomes[key] for number in range(1, k + 1) if (key := (task.task_id, number)) in outcomes]
        for task in tasks
    }


def write_summary(layout: EvalLayout, summary: EvalSummary) -> None:
    write_atomically(layout.summary, summary.model_dump_json(indent=2))
    write_atomically(layout.index, render_index(summary, layout.href))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _validate(tasks: Sequence[RolloutRequest], k: int, concurrency: int | None) -> None:
    if not tasks:
        raise EvalError("no tasks to run")
    if k < 1 or (concurrency is not None and concurrency < 1):
        raise EvalError(f"k and concurrency must be at least 1, got k={k}, concurrency={concurrency}")
    _require_distinct(tasks)


def start_directory(
    layout: EvalLayout, config: EvalConfig, tasks: Sequence[RolloutRequest], *, retry_infra: bool
) -> Plan:
    layout.root.mkdir(parents=True, exist_ok=True)
    write_atomically(layout.config, config.model_dump_json(indent=2))
    return plan_attempts(tasks, config.k, layout, retry_infra=retry_infra)


async def run_eval(
    tasks: Sequence[RolloutRequest],
    *,
    out: Path,
    k: int,
    runner: Runner | None = None,
    concurrency: int | None = None,
    threshold: float = 1.0,
    retry_infra: bool = False,
    force: bool = False,
    inputs: Sequence[str] = (),
    report: Report | None = None,
) -> EvalSummary:
    """Run every task k times on `runner` (None: `InProcess()`, the default backend in this process), at most
    `concurrency` at once (None: the runner's `capabilities.max_concurrency`); write each result under `out` as it
    finishes, then summary.json and index.html. Attempts saved in `out` by an earlier run are kept (those that failed
    on our side run again with `retry_infra`). Progress lines go to `report` (default: stderr). The runner is the
    caller's: it is neither started nor closed here, so one runner (a cluster's) serves many evals."""
    started = time.monotonic()
    report = report or _stderr
    _validate(tasks, k, concurrency)
    runner = runner or InProcess()
    concurrency = runner.capabilities.max_concurrency if concurrency is None else concurrency
    layout = EvalLayout(Path(out))
    run_one, runs_on = _on(runner), runner.capabilities.where
    model = describe_model(tasks)
    task_ids = [task.task_id for task in tasks]
    config = EvalConfig(k=k, model=model, threshold=threshold, inputs=list(inputs), tasks=task_ids, runs_on=runs_on)
    await asyncio.to_thread(_check_config, layout, config, force=force)
    plan = await asyncio.to_thread(start_directory, layout, config, tasks, retry_infra=retry_infra)
    for note in plan.notes:
        report(note)
    report(_start_line(plan, len(tasks) * k))
    finished = await _run_pending(plan.pending, run_one, layout, concurrency, report)
    outcomes = _outcomes_by_task(tasks, k, {**plan.kept, **finished})
    run_wall_s = round(time.monotonic() - started, 3)
    summary = summarize(outcomes, k=k, threshold=threshold, model=model, run_wall_s=run_wall_s)
    await asyncio.to_thread(write_summary, layout, summary)
    return summary


def _run_to_completion(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, or, inside a running event loop (a notebook's), asyncio.run in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="opencode-env-eval") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _blocking(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return _run_to_completion(function(*args, **kwargs))

    return call


run_eval_sync = _blocking(run_eval)
"""`run_eval` for code without an event loop, and for notebooks (whose loop is already running)."""
