"""What verify costs in the agent's sandbox (as the grader) against a fresh sandbox, side by side in one run.

    uv run python -m bench.verify_overhead [--runs 7] [--files 0,2000]

Oracle rollouts of the demo task (the solution writes add.py, no model, no OpenCode) isolate the verify phase; the
work dir gets `--files` extra small files (a repository's worth makes the hand-over and the copy visible). For each
size the two kinds alternate, so machine noise falls on both alike. Prints p10/p50/p90 of the verify phase and of
the whole rollout, and the ratios fresh / same.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.testing.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.wire import RolloutRequest, VerifySandbox

SOLUTION = "printf 'def add(a, b):\\n    return a + b\\n' > add.py"


def request(kind: VerifySandbox, files: int) -> RolloutRequest:
    many = f"mkdir -p repo && for i in $(seq {files}); do echo $i > repo/f$i.py; done" if files else "true"
    return RolloutRequest(
        instruction=DEMO_INSTRUCTION,
        solution=[SOLUTION, many],
        verify=DEMO_VERIFY,
        verify_sandbox=kind,
        task_id="verify-bench",
    )


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    tenth = ordered[len(ordered) // 10]
    ninetieth = ordered[min(len(ordered) - 1, (len(ordered) * 9) // 10)]
    return f"{tenth:7.3f} {statistics.median(ordered):7.3f} {ninetieth:7.3f}"


async def measure(backend: LocalBackend, runs: int, files: int) -> dict[str, dict[str, list[float]]]:
    seen: dict[str, dict[str, list[float]]] = {kind: {"verify": [], "wall": []} for kind in ("same", "fresh")}
    for run in range(runs + 1):
        for kind in ("same", "fresh") if run % 2 else ("fresh", "same"):
            result = await run_rollout(request(kind, files), backend)  # type: ignore[arg-type]
            if result.status != "completed" or result.reward != 1.0:
                raise RuntimeError(f"the {kind} oracle did not reach 1.0: {result.status} {result.error}")
            if run:
                seen[kind]["verify"].append(result.timings.verify_s or 0.0)
                seen[kind]["wall"].append(result.wall_s)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--files", default="0,2000", help="extra files in the work dir, comma-separated sizes")
    args = parser.parse_args()
    backend = LocalBackend(cached_tools)
    print(f"oracle rollouts of the demo task, {args.runs} runs per kind (seconds: p10 p50 p90)")
    print(f"{'work dir':<14}{'verify in':<11}{'verify phase':>24}{'whole rollout':>26}")
    for files in (int(size) for size in args.files.split(",")):
        seen = asyncio.run(measure(backend, args.runs, files))
        for kind, values in seen.items():
            print(f"{files:>6} files  {kind:<11}{spread(values['verify']):>24}{spread(values['wall']):>26}")
        ratio = statistics.median(seen["fresh"]["verify"]) / statistics.median(seen["same"]["verify"])
        added = statistics.median(seen["fresh"]["wall"]) - statistics.median(seen["same"]["wall"])
        print(f"{'':14}fresh / same: verify {ratio:.2f}x, rollout {added:+.3f} s")


if __name__ == "__main__":
    main()
