"""What Ray adds to a rollout, and how rollouts/min grows from one simulated node to two, on this machine, in one run.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run --frozen --extra ray python -m bench.ray_overhead [--runs 6] [--batch 8]

1. Per-rollout wall time (p50 of `--runs` sequential oracle rollouts, the caller's clock) three ways, interleaved:
   a direct `run_rollout` on a local backend in this process; through the cluster's long-lived runner actor
   (opencode_env.cluster, what the package uses); through one Ray task per rollout (a backend made in the task's
   worker). Overhead = p50 minus the direct p50.
2. Rollouts/min for a batch of `--batch` oracle rollouts on one node, then on two (a second node added to the same
   simulated cluster); each node advertises --slots.
3. A task image shipped through Ray's object store: `podman save` of the base image, `ray.put`, a task on another
   node reading it, `podman load` (what a node without the image would do), against the image's size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from opencode_env.cluster import SLOT_RESOURCE, NodeConfig, RayRollouts
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import make_backend
from opencode_env.sandbox.local.images import BASE_IMAGE
from opencode_env.wire import RolloutRequest, RolloutResult

WORKDIR = "/home/user/workdir"


def oracle(task_id: str) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "instruction": "Write 42 to answer.txt",
            "task_id": task_id,
            "verify": [f'cd {WORKDIR} && test "$(cat answer.txt)" = 42'],
            "solution": [f"echo 42 > {WORKDIR}/answer.txt"],
        }
    )


@ray.remote(num_cpus=0, max_retries=0)
def rollout_in_task(request_json: str, base_dir: str) -> tuple[str, int, int]:
    """One rollout in a Ray task: a local backend made in this worker, the result, the worker's pid and RSS (KiB)."""
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.tools import cached_tools

    backend = LocalBackend(cached_tools, base_dir=Path(base_dir))
    result = asyncio.run(run_rollout(RolloutRequest.model_validate_json(request_json), backend))
    rss = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if "VmRSS" in line)
    return result.model_dump_json(), os.getpid(), rss


def add_node(cluster: Cluster, slots: int, *, head: bool = False) -> None:
    args = {"num_cpus": 1, "resources": {SLOT_RESOURCE: slots}, "object_store_memory": 300 * 2**20}
    if head:
        args["include_dashboard"] = False
    cluster.add_node(**args)


def check(result: RolloutResult) -> None:
    if (result.status, result.reward) != ("completed", 1.0):
        raise SystemExit(f"a bench rollout failed: {result.status} {result.error}")


async def per_rollout(driver: RayRollouts, base: str, runs: int) -> dict[str, list[float]]:
    backend = make_backend("local")
    times: dict[str, list[float]] = {"direct (this process)": [], "ray actor (opencode_env.cluster)": []}
    task_times: list[float] = []
    for run in range(runs + 1):
        started = time.monotonic()
        direct = await run_rollout(oracle(f"direct-{run}"), backend)
        direct_s = time.monotonic() - started
        started = time.monotonic()
        through_actor = await driver.run_rollout(oracle(f"actor-{run}"))
        actor_s = time.monotonic() - started
        check(direct)
        check(through_actor)
        if run:  # the first of each warms caches (the worker's imports, the node's setup)
            times["direct (this process)"].append(direct_s)
            times["ray actor (opencode_env.cluster)"].append(actor_s)
    await driver.close()
    for run in range(runs + 1):
        started = time.monotonic()
        answer, _, _ = await rollout_in_task.options(resources={SLOT_RESOURCE: 1}).remote(
            oracle(f"task-{run}").model_dump_json(), base
        )
        check(RolloutResult.model_validate_json(answer))
        if run:
            task_times.append(time.monotonic() - started)
    times["ray task (a backend per task)"] = task_times
    return times


async def throughput(driver: RayRollouts, batch: int) -> float:
    requests = [oracle(f"batch-{index}") for index in range(batch)]
    started = time.monotonic()
    results = await driver.run_rollouts(requests, progress=False)
    for result in results:
        check(result)
    return batch / (time.monotonic() - started) * 60


async def task_processes(base: str, slots: int) -> tuple[int, float]:
    """Distinct worker processes and their mean RSS (MiB) when `slots` rollouts run as tasks at once."""
    calls = [
        rollout_in_task.options(resources={SLOT_RESOURCE: 1}).remote(oracle(f"rss-{i}").model_dump_json(), base)
        for i in range(slots)
    ]
    answers = await asyncio.gather(*calls)
    pids = {pid for _, pid, _ in answers}
    return len(pids), statistics.mean(rss for _, _, rss in answers) / 1024


def image_shipping() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "image.tar"
        started = time.monotonic()
        subprocess.run(["podman", "save", "-q", "-o", str(archive), BASE_IMAGE], check=True)
        saved_s = time.monotonic() - started
        size = archive.stat().st_size
        started = time.monotonic()
        ref = ray.put(archive.read_bytes())
        received = ray.get(_size_of.remote(ref))
        shipped_s = time.monotonic() - started
        started = time.monotonic()
        subprocess.run(["podman", "load", "-q", "-i", str(archive)], check=True, capture_output=True)
        loaded_s = time.monotonic() - started
    if received != size:
        raise SystemExit(f"the object store gave {received} bytes of {size}")
    return {
        "size MiB": round(size / 2**20, 1),
        "podman save s": round(saved_s, 2),
        "object store s": round(shipped_s, 2),
        "podman load s": round(loaded_s, 2),
    }


@ray.remote(num_cpus=0, max_retries=0)
def _size_of(data: bytes) -> int:
    return len(data)


async def bench(runs: int, batch: int, slots: int) -> None:
    base = tempfile.mkdtemp(prefix="ray-bench-")
    started = time.monotonic()
    cluster = Cluster(initialize_head=False)
    add_node(cluster, slots, head=True)
    ray.init(address=cluster.address, log_to_driver=False)
    print(f"cluster of one node up in {time.monotonic() - started:.1f} s")
    try:
        config = NodeConfig(base_dir=base)
        driver = RayRollouts(cluster.address, node_config=config)
        await driver.start()
        times = await per_rollout(driver, base, runs)
        direct = statistics.median(times["direct (this process)"])
        print(f"\nper-rollout wall time, p50 of {runs} sequential oracle rollouts (caller's clock)")
        print(f"{'path':36} {'p50 s':>7} {'overhead s':>11} {'ratio':>6}")
        for name, values in times.items():
            p50 = statistics.median(values)
            print(f"{name:36} {p50:7.3f} {p50 - direct:11.3f} {p50 / direct:6.2f}")
        workers, rss = await task_processes(base, slots)
        print(f"\n{slots} rollouts at once as tasks: {workers} worker processes, mean RSS {rss:.0f} MiB each")
        one = RayRollouts(cluster.address, node_config=config)
        await one.start()
        await throughput(one, slots)  # warm-up
        one_node = await throughput(one, batch)
        add_node(cluster, slots)
        await one.start()
        await throughput(one, slots)
        two_nodes = await throughput(one, batch)
        await one.close()
        print(f"\nrollouts/min, a batch of {batch} oracle rollouts, {slots} slots per node, {os.cpu_count()} cores")
        print(f"1 node: {one_node:6.1f}\n2 nodes: {two_nodes:5.1f}   ratio {two_nodes / one_node:.2f}")
        shipping = image_shipping()
        print(f"\nthe base image through Ray's object store: {shipping}")
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(bench(args.runs, args.batch, args.slots))


if __name__ == "__main__":
    main()
