"""What the grader's box costs on the clouds, over the fakes: VM-seconds, VMs alive while the agent runs, the verify
phase and the whole rollout, with the grader's VM opened beside the agent ("before": right after setup) and when the
agent ends ("after", the clouds' default), side by side in one run.

    uv run python -m bench.cloud_grader_cost [--runs 3] [--agent-s 20] [--setup-s 2] [--providers e2b,hf]

Oracle rollouts graded in the grader's box: setup sleeps `--setup-s` (replayed in the grader's VM), the "agent" sleeps
`--agent-s` then writes add.py, verify runs the demo's pytest. VM-seconds are the fake cloud's live VMs sampled every
10 ms; one VM's seconds is the rollout's wall time (its agent's VM lives through all of it). Prints p50 of each, and
the ratio of VM-seconds to one VM's. The slots a cap of N gives agents follow from admission: two reserved per
rollout before (N // 2 agents), one per agent after with one kept for graders (N - 1; tests/unit/test_cloud_admission.py
drives it over generated mixes).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.cloud.hf import HFBackend
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FAKE_TOOLS_DIR, FakeHfCloud
from opencode_env.wire import RolloutRequest

RIGHT = "printf 'def add(a, b):\\n    return a + b\\n' > add.py"
MODES = ("before", "after")


def backend_over(cloud: FakeCloud | FakeHfCloud, mode: str) -> SandboxBackend:
    backend: SandboxBackend
    if isinstance(cloud, FakeCloud):
        backend = E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key)
    else:
        backend = HFBackend(
            sandbox_class=cloud.sandbox_class(), token=cloud.token, image="opencode-env", tools_dir=FAKE_TOOLS_DIR
        )
    backend.capabilities = dataclasses.replace(backend.capabilities, grader_box_at_agent_end=mode == "after")
    return backend


async def one(cloud: FakeCloud | FakeHfCloud, mode: str, agent_s: float, setup_s: float) -> dict[str, float]:
    request = RolloutRequest(
        instruction=DEMO_INSTRUCTION,
        setup=[f"sleep {setup_s}"],
        solution=[f"sleep {agent_s}", RIGHT],
        verify=DEMO_VERIFY,
        task_id="grader-cost",
    )
    phase = {"now": "sandbox"}
    vm_s, agent_peak = 0.0, 0
    running = True

    async def sample() -> None:
        nonlocal vm_s, agent_peak
        last = time.monotonic()
        while running:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            vm_s += len(cloud.alive) * (now - last)
            last = now
            if phase["now"] not in ("verify", "collect"):
                agent_peak = max(agent_peak, len(cloud.alive))

    def progress(name: str, _: str) -> None:
        phase["now"] = name

    sampler = asyncio.ensure_future(sample())
    try:
        result = await run_rollout(request, backend_over(cloud, mode), progress=progress)
    finally:
        running = False
        await sampler
    if (result.status, result.reward) != ("completed", 1.0):
        raise SystemExit(f"{mode}: the oracle did not reach 1.0: {result.status} {result.error}")
    return {
        "vm_s": vm_s,
        "wall": result.wall_s,
        "ratio": vm_s / result.wall_s,
        "verify": result.timings.verify_s,
        "agent_vms": float(agent_peak),
    }


def cloud_for(provider: str, base: Path) -> FakeCloud | FakeHfCloud:
    return FakeCloud(base_dir=base) if provider == "e2b" else FakeHfCloud(base_dir=base)


async def bench(providers: list[str], runs: int, agent_s: float, setup_s: float) -> None:
    for provider in providers:
        base = Path(tempfile.mkdtemp(prefix="grader-cost-"))
        cloud = cloud_for(provider, base)
        measured: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        try:
            for round_ in range(runs):
                for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                    measured[mode].append(await one(cloud, mode, agent_s, setup_s))
        finally:
            if isinstance(cloud, FakeHfCloud):
                cloud.kill_all()
            shutil.rmtree(base, ignore_errors=True)
        print(f"\n{provider} fake, {runs} runs each, agent {agent_s:g} s, setup {setup_s:g} s (p50)")
        print(f"{'':28}{'before':>10}{'after':>10}{'after/before':>14}")
        for key, label in (
            ("vm_s", "VM-seconds"),
            ("ratio", "VM-s / one VM's seconds"),
            ("agent_vms", "VMs alive before verify"),
            ("verify", "verify phase (s)"),
            ("wall", "whole rollout (s)"),
        ):
            before = statistics.median(run[key] for run in measured["before"])
            after = statistics.median(run[key] for run in measured["after"])
            print(f"{label:28}{before:10.2f}{after:10.2f}{after / before:14.2f}")
    print("\nagents at once under a cap of N: before N // 2 (two slots reserved a rollout), after N - 1")
    for cap in (2, 4, 20):
        print(f"  cap {cap:>2}: before {cap // 2:>2}, after {cap - 1:>2}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--agent-s", type=float, default=20.0)
    parser.add_argument("--setup-s", type=float, default=2.0)
    parser.add_argument("--providers", default="e2b,hf")
    args = parser.parse_args()
    asyncio.run(bench(args.providers.split(","), args.runs, args.agent_s, args.setup_s))


if __name__ == "__main__":
    main()
