"""The audit's speed on this machine: (1) one play's rollout beside the task's oracle rollout, interleaved one at a
time, wall and CPU seconds side by side (CPU: this process and the sandboxes it waited for); (2) a whole audit of a few
tasks of examples/audit, as task x play pairs played per minute.

    uv run python -m bench.audit_throughput [--tasks exit-status-import,clean-answer-file] [--pairs 3] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.rollout_measure import load_line
from opencode_env.audit.driver import Audit
from opencode_env.audit.inputs import load_audit_inputs
from opencode_env.audit.layouts import native, play_command
from opencode_env.audit.plays import panel
from opencode_env.rollout.in_process import InProcess
from opencode_env.wire import RolloutRequest

DATASET = Path(__file__).resolve().parent.parent / "examples" / "audit"


def cpu_now() -> float:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


async def timed(runner: InProcess, request: RolloutRequest) -> tuple[float, float]:
    wall, cpu = time.monotonic(), cpu_now()
    result = await runner.run_rollout(request)
    if result.status != "completed":
        raise SystemExit(f"a bench rollout did not complete: {result.status} {result.error}")
    return time.monotonic() - wall, cpu_now() - cpu


async def side_by_side(runner: InProcess, pairs: int) -> None:
    loaded = load_audit_inputs([DATASET / "exit-status-import.json"])
    task = loaded.tasks[0]
    play = next(play for play in panel() if play.name == "exit-zero-import")
    oracle = native(task.oracle)
    played = native(task.request.model_copy(update={"solution": [play_command(play)]}))
    costs: dict[str, list[tuple[float, float]]] = {"oracle": [], "play": []}
    for _ in range(pairs):
        costs["oracle"].append(await timed(runner, oracle))
        costs["play"].append(await timed(runner, played))
    print(f"one at a time, {pairs} pairs interleaved (native layout, exit-status-import, play exit-zero-import):")
    for name, values in costs.items():
        wall = statistics.median(value[0] for value in values)
        cpu = statistics.median(value[1] for value in values)
        print(f"  {name:<7} median wall {wall:5.2f} s   CPU {cpu:5.2f} s")
    ratio_wall = statistics.median(v[0] for v in costs["play"]) / statistics.median(v[0] for v in costs["oracle"])
    ratio_cpu = statistics.median(v[1] for v in costs["play"]) / statistics.median(v[1] for v in costs["oracle"])
    print(f"  play / oracle: wall {ratio_wall:.2f}, CPU {ratio_cpu:.2f}")


async def whole_audit(runner: InProcess, names: list[str], concurrency: int) -> None:
    loaded = load_audit_inputs([DATASET / f"{name}.json" for name in names])
    with tempfile.TemporaryDirectory() as out:
        audit = Audit(runner, panel(), Path(out), concurrency=concurrency)
        started, cpu = time.monotonic(), cpu_now()
        report = await audit.run(loaded.tasks)
        wall, used = time.monotonic() - started, cpu_now() - cpu
    played = sum(1 for task in report.tasks for record in task.records if record.result_file)
    pairs = sum(
        1
        for task in report.tasks
        for record in task.records
        if record.layout == "native" and record.outcome != "not_applicable"
    )
    print(f"whole audit of {len(names)} tasks x {len(report.plays)} plays at concurrency {concurrency}:")
    others = report.rollouts - played
    print(f"  {report.rollouts} rollouts ({played} plays, {others} oracle and do-nothing) in {wall:.0f} s")
    per_minute = pairs / wall * 60
    print(
        f"  {pairs} task x play pairs played: {per_minute:.1f} per minute, {report.rollouts / wall * 60:.1f} rollouts"
    )
    print(f"  CPU {used:.0f} s: {used / report.rollouts:.2f} s per rollout")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="exit-status-import,clean-answer-file")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    print(load_line())
    runner = InProcess()
    await side_by_side(runner, args.pairs)
    await whole_audit(runner, args.tasks.split(","), args.concurrency)
    print(load_line())


if __name__ == "__main__":
    asyncio.run(main())
