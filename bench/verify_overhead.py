"""What grading in the grader's box (verify_sandbox="fresh", the default) costs against grading in the agent's own
box as the grader (verify_sandbox="same", the hand-over of before), side by side in one run.

    uv run python -m bench.verify_overhead [--runs 7] [--files 0,2000] [--backends local,e2b-fake,hf-fake]

Oracle rollouts of the demo task (the solution writes add.py, no model, no OpenCode) isolate the verify phase; the
work dir gets `--files` extra small files (a repository's worth makes the hand-over and the copy visible). For each
backend and size the two kinds alternate, so machine noise falls on both alike. Prints p10/p50/p90 of the verify
phase and of the whole rollout, what the grader's box adds at p50, and the copy's own p50. The grader's box is made
and set up beside the agent, so an agent phase longer than its start hides that part: an oracle's is a few
milliseconds, so these figures are the worst case. The cloud fakes run each SDK call as a local sandbox command,
so their absolute times say little about E2B or Hugging Face; the number of VM commands and the ratio carry over.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.wire import RolloutRequest, VerifySandbox

COPY_TIME = re.compile(r"not carried, ([0-9.]+) s\)")
"""The copy's own duration, as verify_phase writes it into result.enforcement['verify']."""
SOLUTION = "printf 'def add(a, b):\\n    return a + b\\n' > add.py"
KINDS: tuple[VerifySandbox, VerifySandbox] = ("same", "fresh")


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


async def measure(backend: SandboxBackend, runs: int, files: int) -> dict[str, dict[str, list[float]]]:
    seen: dict[str, dict[str, list[float]]] = {kind: {"verify": [], "wall": [], "copy": []} for kind in KINDS}
    for run in range(runs + 1):
        for kind in KINDS if run % 2 else KINDS[::-1]:
            result = await run_rollout(request(kind, files), backend)
            if result.status != "completed" or result.reward != 1.0:
                raise RuntimeError(f"the {kind} oracle did not reach 1.0: {result.status} {result.error}")
            if run:
                seen[kind]["verify"].append(result.timings.verify_s or 0.0)
                seen[kind]["wall"].append(result.wall_s)
                copied = COPY_TIME.search(result.enforcement.get("verify", ""))
                seen[kind]["copy"].append(float(copied.group(1)) if copied else 0.0)
    return seen


def local() -> tuple[SandboxBackend, Callable[[], None]]:
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.tools import cached_tools

    return LocalBackend(cached_tools), lambda: None


def e2b_fake() -> tuple[SandboxBackend, Callable[[], None]]:
    from opencode_env.sandbox.cloud.e2b import E2BBackend
    from opencode_env.testing.fake_e2b import FakeCloud

    base = Path(tempfile.mkdtemp(prefix="verify-bench-"))
    cloud = FakeCloud(base_dir=base)
    return E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key), lambda: shutil.rmtree(base)


def hf_fake() -> tuple[SandboxBackend, Callable[[], None]]:
    from opencode_env.sandbox.cloud.hf import HFBackend
    from opencode_env.testing.fake_hf import FAKE_TOOLS_DIR, FakeHfCloud

    base = Path(tempfile.mkdtemp(prefix="verify-bench-"))
    cloud = FakeHfCloud(base_dir=base)
    backend = HFBackend(
        sandbox_class=cloud.sandbox_class(), token=cloud.token, image="opencode-env", tools_dir=FAKE_TOOLS_DIR
    )

    def done() -> None:
        cloud.kill_all()
        shutil.rmtree(base)

    return backend, done


BACKENDS = {"local": local, "e2b-fake": e2b_fake, "hf-fake": hf_fake}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--files", default="0,2000", help="extra files in the work dir, comma-separated sizes")
    parser.add_argument("--backends", default="local,e2b-fake,hf-fake", help=f"some of {', '.join(BACKENDS)}")
    args = parser.parse_args()
    print(f"oracle rollouts of the demo task, {args.runs} runs per kind (seconds: p10 p50 p90)")
    print(f"{'backend':<10}{'work dir':<14}{'graded in':<11}{'verify phase':>24}{'whole rollout':>26}")
    for name in args.backends.split(","):
        backend, done = BACKENDS[name]()
        try:
            for files in (int(size) for size in args.files.split(",")):
                seen = asyncio.run(measure(backend, args.runs, files))
                for kind, values in seen.items():
                    shown = "agent box" if kind == "same" else "fresh box"
                    verify, wall = spread(values["verify"]), spread(values["wall"])
                    print(f"{name:<10}{files:>6} files  {shown:<11}{verify:>24}{wall:>26}")
                same, fresh = (statistics.median(seen[kind]["verify"]) for kind in KINDS)
                added = statistics.median(seen["fresh"]["wall"]) - statistics.median(seen["same"]["wall"])
                ratio = f"verify {fresh / same:.2f}x ({fresh - same:+.3f} s)"
                copy = statistics.median(seen["fresh"]["copy"])
                print(f"{'':24}fresh / agent box: {ratio}, rollout {added:+.3f} s; the copy itself {copy:.3f} s")
        finally:
            done()


if __name__ == "__main__":
    main()
