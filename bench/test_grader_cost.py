"""What the isolated test grader costs (its runner, the canaries, the tripwires), against a checkout of the code
before it, side by side in one run.

    uv run python -m bench.test_grader_cost --before /path/to/older/checkout [--rounds 5]

Oracle rollouts of `examples/task_add_tests.json`'s shape in the base image (the solution writes add.py, the request
hands over tests and the ids that must pass). Each round runs one rollout in a child process importing the older
checkout and one importing this one, in alternating order, so machine noise falls on both alike. Prints p10/p50/p90
of the pytest command alone, the verify phase and the whole rollout, and the added p50 seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.grader_overhead import spread

HERE = Path(__file__).resolve().parents[1]
CHILD = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.wire import RolloutRequest

test = "from add import add\\n\\n\\ndef test_add():\\n    assert add(2, 3) == 5\\n"
test += "\\n\\ndef test_zero():\\n    assert add(0, 0) == 0\\n"
request = RolloutRequest(
    instruction="Write add.py",
    image=build_base_image(tag="localhost/opencode-env-grader-tests:bookworm"),
    solution=["printf 'def add(a, b):\\\\n    return a + b\\\\n' > add.py"],
    tests={
        "files": {"test_add.py": test},
        "fail_to_pass": ["test_add.py::test_add"],
        "pass_to_pass": ["test_add.py::test_zero"],
    },
    task_id="test-grader-bench",
)
result = asyncio.run(run_rollout(request, LocalBackend(cached_tools)))
if result.status != "completed" or result.reward != 1.0:
    raise SystemExit(f"the oracle did not reach 1.0: {result.status} {result.error} {result.verify_results}")
pytest = result.verify_results[-1].duration_s
print(json.dumps({"pytest": pytest, "verify": result.timings.verify_s, "wall": result.wall_s}))
"""
PHASES = ("pytest", "verify", "wall")


def one(checkout: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(checkout)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    measured: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": HERE}
    seen: dict[str, dict[str, list[float]]] = {name: {phase: [] for phase in PHASES} for name in checkouts}
    for index in range(args.rounds):
        for name in ("before", "after") if index % 2 else ("after", "before"):
            for phase, value in one(checkouts[name]).items():
                seen[name][phase].append(value)
    print(f"oracle rollouts graded by test id, {args.rounds} rounds (seconds: p10 p50 p90)")
    print(f"{'code':<8}" + "".join(f"{phase:>22}" for phase in PHASES))
    for name, values in seen.items():
        print(f"{name:<8}" + "".join(f"{spread(values[phase]):>22}" for phase in PHASES))
    added = {
        phase: statistics.median(seen["after"][phase]) - statistics.median(seen["before"][phase]) for phase in PHASES
    }
    ratio = statistics.median(seen["after"]["pytest"]) / statistics.median(seen["before"]["pytest"])
    print("added p50: " + ", ".join(f"{phase} {value:+.3f} s" for phase, value in added.items()))
    print(f"pytest command p50, after/before: {ratio:.2f}x")


if __name__ == "__main__":
    main()
