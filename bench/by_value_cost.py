"""What grading by value costs beside grading in process: oracle rollouts of `examples/task_add_tests.json`'s shape in
the base image, the same request with `tests.mode` in_process and by_value, alternating in one run so machine noise
falls on both alike. Prints p10/p50/p90 of the pytest command, the verify phase and the whole rollout, and the p50
ratios by value / in process. Never asserts a time.

    uv run python -m bench.by_value_cost [--rounds 8] [--calls 2]

`--calls` is how many graded calls each test makes (by value each is a round trip to the code's process).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench.grader_overhead import spread
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.wire import RolloutRequest, RolloutResult

MODES = ("in_process", "by_value")
PHASES = ("pytest", "verify", "wall")


def request(image: str, mode: str, calls: int) -> RolloutRequest:
    checks = "".join(f"    assert add({index}, 1) == {index + 1}\n" for index in range(calls))
    test = f"from add import add\n\n\ndef test_add():\n{checks}\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
    return RolloutRequest.model_validate(
        {
            "instruction": "Write add.py",
            "image": image,
            "solution": ["printf 'def add(a, b):\\n    return a + b\\n' > add.py"],
            "tests": {
                "files": {"test_add.py": test},
                "fail_to_pass": ["test_add.py::test_add"],
                "pass_to_pass": ["test_add.py::test_zero"],
                "mode": mode,
            },
            "task_id": "by-value-cost",
        }
    )


def measured(result: RolloutResult) -> dict[str, float]:
    if result.status != "completed" or result.reward != 1.0:
        raise SystemExit(f"the oracle did not reach 1.0: {result.status} {result.error} {result.verify_results}")
    (pytest,) = [step.duration_s for step in result.verify_results if "pytest-runner" in step.cmd]
    verify = result.timings.verify_s if result.timings.verify_s is not None else float("nan")
    return {"pytest": pytest, "verify": verify, "wall": result.wall_s}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args()
    backend = LocalBackend(cached_tools)
    image = build_base_image(tag="localhost/opencode-env-grader-tests:bookworm")
    seen: dict[str, dict[str, list[float]]] = {mode: {phase: [] for phase in PHASES} for mode in MODES}
    for index in range(args.rounds):
        for mode in MODES if index % 2 else tuple(reversed(MODES)):
            result = await run_rollout(request(image, mode, args.calls), backend)
            for phase, value in measured(result).items():
                seen[mode][phase].append(value)
    print(f"oracle rollouts graded by test id, {args.calls} calls per test, {args.rounds} rounds (s: p10 p50 p90)")
    print(f"{'mode':<12}" + "".join(f"{phase:>22}" for phase in PHASES))
    for mode, values in seen.items():
        print(f"{mode:<12}" + "".join(f"{spread(values[phase]):>22}" for phase in PHASES))
    ratios = {
        phase: statistics.median(seen["by_value"][phase]) / statistics.median(seen["in_process"][phase])
        for phase in PHASES
    }
    print("p50 by value / in process: " + ", ".join(f"{phase} {ratio:.2f}x" for phase, ratio in ratios.items()))


if __name__ == "__main__":
    asyncio.run(main())
