"""What the hardened grader costs (the snapshot after setup, the check and put-back before verify, verify's own
bytecode cache), against a checkout of the code before it, side by side in one run.

    uv run python -m bench.grader_overhead --before /path/to/older/checkout [--rounds 5] [--files 0,2000]

Oracle rollouts of the README's task pattern in the base image (the solution writes add.py, protected tests are
handed over in verify_files, verify runs `python3 -m pytest -q tests`), with `--files` extra small files in the
work dir. Each round runs one rollout in a child process importing the older checkout and one importing this one,
in alternating order, so machine noise falls on both alike. Prints p10/p50/p90 of the setup phase (where the
snapshot is), the verify phase and the whole rollout, and the added p50 seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CHILD = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.wire import RolloutRequest

files = int(sys.argv[2])
many = f"mkdir -p repo && for i in $(seq {files}); do echo $i > repo/f$i.py; done" if files else "true"
request = RolloutRequest(
    instruction="Write add.py",
    image=build_base_image(tag="localhost/opencode-env-grader-tests:bookworm"),
    solution=["printf 'def add(a, b):\\\\n    return a + b\\\\n' > add.py", many],
    verify_files={"tests/test_add.py": "from add import add\\n\\n\\ndef test_add():\\n    assert add(2, 3) == 5\\n"},
    verify=["cd /home/user/workdir && python3 -m pytest -q tests"],
    task_id="grader-bench",
)
result = asyncio.run(run_rollout(request, LocalBackend(cached_tools)))
if result.status != "completed" or result.reward != 1.0:
    raise SystemExit(f"the oracle did not reach 1.0: {result.status} {result.error} {result.verify_results}")
print(json.dumps({"setup": result.timings.setup_s, "verify": result.timings.verify_s, "wall": result.wall_s}))
"""
PHASES = ("setup", "verify", "wall")


def one(checkout: Path, files: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(checkout), str(files)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    measured: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    tenth = ordered[len(ordered) // 10]
    ninetieth = ordered[min(len(ordered) - 1, (len(ordered) * 9) // 10)]
    return f"{tenth:6.2f} {statistics.median(ordered):6.2f} {ninetieth:6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", default="0,2000", help="extra files in the work dir, comma-separated sizes")
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": HERE}
    print(f"oracle rollouts of the README task pattern, {args.rounds} rounds (seconds: p10 p50 p90)")
    print(f"{'work dir':<14}{'code':<8}" + "".join(f"{phase:>22}" for phase in PHASES))
    for files in (int(size) for size in args.files.split(",")):
        seen: dict[str, dict[str, list[float]]] = {name: {phase: [] for phase in PHASES} for name in checkouts}
        for index in range(args.rounds):
            order = ("before", "after") if index % 2 else ("after", "before")
            for name in order:
                for phase, value in one(checkouts[name], files).items():
                    seen[name][phase].append(value)
        for name, values in seen.items():
            print(f"{files:>6} files  {name:<8}" + "".join(f"{spread(values[phase]):>22}" for phase in PHASES))
        added = {
            phase: statistics.median(seen["after"][phase]) - statistics.median(seen["before"][phase])
            for phase in PHASES
        }
        print(f"{'':14}added p50: " + ", ".join(f"{phase} {value:+.3f} s" for phase, value in added.items()))


if __name__ == "__main__":
    main()
