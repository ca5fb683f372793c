"""What Ray adds to a rollout, in CPU-seconds and wall time, against the same rollout run locally, in one run.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run --frozen --extra ray python -m bench.ray_overhead [--pairs 20] [--real 10]

A simulated one-node cluster (`ray.cluster_utils.Cluster`, started lean: node.py's LEAN_* switches; `--ray-defaults`
starts it with Ray's own defaults instead). `--pairs` oracle rollouts each way, interleaved one by one (local, Ray,
local, Ray...), after one warm-up of each:
- local: `run_rollout` on a local backend in a plain Python process of its own (no Ray in it), its CPU (its own and
  its waited-for children's: the sandboxes) read from /proc around each rollout;
- Ray: the same request through `RayRollouts` to the node's long-lived runner; CPU split three ways, read around each
  rollout: the runner actor (its process and its sandboxes), the driver (this process), and Ray's own processes
  (every other descendant of this process: GCS, raylet, agents, idle workers); the local path's CPU counts what
  this process did meanwhile too.
`--real N` adds N pairs of the demo task run by the real OpenCode, each against a scripted model of its own served
from this process (its serving counts on both paths).
Printed: per-rollout means with 95% bootstrap confidence intervals, the paired difference, the wall-time ratio, what
Ray's own processes cost while idle (per second, during the local rollouts) and hold (RSS), and the fixed costs (the
cluster's start, a driver's start: connect, place and prepare a runner per node) that a driver pays once, not per
eval. `--tasks`, `--scaling` and `--image` add the older sections (one Ray task per rollout; one node against two;
an image through the object store): on one machine two "nodes" share its cores, so `--scaling` cannot show a
cluster's gain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from bench.rollout_measure import RolloutWorker, check, cpu_s, load_line, oracle
from bench.stats import mean_ci
from opencode_env.cluster import SLOT_RESOURCE, NodeConfig, RayRollouts
from opencode_env.cluster.node import LEAN_NODE_ARGS, LEAN_RAY_ENV, LEAN_SYSTEM_CONFIG
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.images.store import BASE_IMAGE
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import RolloutRequest, RolloutResult

RequestMaker = Callable[[str], AbstractContextManager[RolloutRequest]]


@ray.remote(num_cpus=0, max_retries=0)
def rollout_in_task(request_json: str, base_dir: str) -> tuple[str, int, int]:
    """One rollout in a Ray task: a local backend made in this worker, the result, the worker's pid and RSS (KiB)."""
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.tools import cached_tools

    backend = LocalBackend(cached_tools, base_dir=Path(base_dir))
    result = asyncio.run(run_rollout(RolloutRequest.model_validate_json(request_json), backend))
    rss = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if "VmRSS" in line)
    return result.model_dump_json(), os.getpid(), rss


def add_node(cluster: Cluster, slots: int, *, head: bool = False, lean: bool = True) -> None:
    args: dict[str, Any] = {"num_cpus": 1, "resources": {SLOT_RESOURCE: slots}, "object_store_memory": 300 * 2**20}
    if lean:
        args.update(LEAN_NODE_ARGS)
        if head:
            args["_system_config"] = dict(LEAN_SYSTEM_CONFIG)
    cluster.add_node(**args)


def descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def rss_mib(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 2**20


class RayProcesses:
    """Ray's own processes: every descendant of this process but the runner's tree and the local worker's."""

    def __init__(self, excluded: set[int]) -> None:
        self.excluded = excluded

    def pids(self) -> set[int]:
        mine = descendants(os.getpid())
        skip = set(self.excluded)
        for pid in self.excluded:
            skip |= descendants(pid)
        return mine - skip

    def cpu_s(self) -> float:
        return sum(cpu_s(pid, children=False) for pid in self.pids())


@contextlib.contextmanager
def oracle_request(task_id: str) -> Iterator[RolloutRequest]:
    yield oracle(task_id)


@contextlib.contextmanager
def real_request(task_id: str) -> Iterator[RolloutRequest]:
    """The demo task run by the real OpenCode, against a scripted model of its own served from this process."""
    with ScriptedModelServer(demo_script()) as model:
        yield demo_request(model.base_url, task_id=task_id)


async def paired(
    driver: RayRollouts, local: RolloutWorker, pairs: int, requests: RequestMaker = oracle_request
) -> dict[str, list[float]]:
    """`pairs` rollouts each way, interleaved, after a warm-up of each; every figure per rollout."""
    [report] = await driver.nodes()
    runner = report.pid
    ray_processes = RayProcesses({runner, local.process.pid})
    figures: dict[str, list[float]] = {
        name: []
        for name in (
            "local wall s",
            "local cpu s",
            "local driver cpu s",
            "ray wall s",
            "ray runner cpu s",
            "ray driver cpu s",
            "ray own processes cpu s",
            "ray idle cpu s per s",
        )
    }
    for index in range(pairs + 1):
        idle_before, idle_started = ray_processes.cpu_s(), time.monotonic()
        with requests(f"local-{index}") as request:
            local_driver_before = cpu_s(os.getpid(), children=False)
            result, wall_s, spent = await asyncio.to_thread(local.rollout, request)
            local_driver_cpu = cpu_s(os.getpid(), children=False) - local_driver_before
        idle_rate = (ray_processes.cpu_s() - idle_before) / (time.monotonic() - idle_started)
        check(result)
        with requests(f"ray-{index}") as request:
            runner_before, driver_before = cpu_s(runner, children=True), cpu_s(os.getpid(), children=False)
            own_before, started = ray_processes.cpu_s(), time.monotonic()
            check(await driver.run_rollout(request))
            ray_wall_s = time.monotonic() - started
        row = {
            "local wall s": wall_s,
            "local cpu s": spent,
            "local driver cpu s": local_driver_cpu,
            "ray wall s": ray_wall_s,
            "ray runner cpu s": cpu_s(runner, children=True) - runner_before,
            "ray driver cpu s": cpu_s(os.getpid(), children=False) - driver_before,
            "ray own processes cpu s": ray_processes.cpu_s() - own_before,
            "ray idle cpu s per s": idle_rate,
        }
        if index:  # the first of each warms caches (imports, the node's image, the runner's first rollout)
            for name, value in row.items():
                figures[name].append(value)
    return figures


def print_paired(figures: dict[str, list[float]], pairs: int, kind: str) -> None:
    """Each path's CPU counts this process's too: the driver's work on the Ray path; on the local path, what this
    process did meanwhile (a real rollout's scripted model is served from here on both paths)."""
    local_cpu = [w + d for w, d in zip(figures["local cpu s"], figures["local driver cpu s"], strict=True)]
    ray_cpu = [
        sum(values)
        for values in zip(
            figures["ray runner cpu s"], figures["ray driver cpu s"], figures["ray own processes cpu s"], strict=True
        )
    ]
    added_cpu = [r - local for r, local in zip(ray_cpu, local_cpu, strict=True)]
    added_wall = [r - local for r, local in zip(figures["ray wall s"], figures["local wall s"], strict=True)]
    print(f"\nper rollout, {pairs} interleaved pairs of {kind} rollouts (mean [95% bootstrap CI])")
    rows = [
        ("local: CPU s, all", local_cpu),
        ("  local worker (process + sandboxes)", figures["local cpu s"]),
        ("  this process meanwhile", figures["local driver cpu s"]),
        ("ray: CPU s, all", ray_cpu),
        ("  runner actor (process + sandboxes)", figures["ray runner cpu s"]),
        ("  driver (this process)", figures["ray driver cpu s"]),
        ("  Ray's own processes", figures["ray own processes cpu s"]),
        ("ray - local: CPU s", added_cpu),
        ("local: wall s", figures["local wall s"]),
        ("ray: wall s", figures["ray wall s"]),
        ("ray - local: wall s", added_wall),
        ("Ray's own processes idle, CPU s per s", figures["ray idle cpu s per s"]),
    ]
    for name, values in rows:
        print(f"{name:40} {mean_ci(values)}")
    ratio = statistics.mean(figures["ray wall s"]) / statistics.mean(figures["local wall s"])
    print(f"{'ray / local: wall':40} {ratio:.3f}")


async def bench(args: argparse.Namespace) -> None:
    base = tempfile.mkdtemp(prefix="ray-bench-")
    lean = not args.ray_defaults
    if lean:
        os.environ.update(LEAN_RAY_ENV)
    print(f"at start: {load_line()}")
    started = time.monotonic()
    cluster = Cluster(initialize_head=False)
    add_node(cluster, args.slots, head=True, lean=lean)
    ray.init(address=cluster.address, log_to_driver=False)
    print(f"a one-node cluster ({'lean' if lean else 'Ray defaults'}) up in {time.monotonic() - started:.1f} s")
    local = RolloutWorker()
    try:
        config = NodeConfig(base_dir=base)
        driver = RayRollouts(cluster.address, node_config=config)
        started = time.monotonic()
        await driver.start()
        print(f"a driver's start (connect, place and prepare the runner): {time.monotonic() - started:.1f} s, once")
        ray_pids = RayProcesses({local.process.pid}).pids()
        print(f"Ray's processes hold {rss_mib(ray_pids):.0f} MiB RSS ({len(ray_pids)} processes, the runner included)")
        figures = await paired(driver, local, args.pairs)
        print_paired(figures, args.pairs, "oracle")
        if args.real:
            print_paired(await paired(driver, local, args.real, real_request), args.real, "real OpenCode")
        await driver.close()
        if args.tasks:
            await tasks_section(base, args)
        if args.scaling:
            await scaling_section(cluster, config, args)
        if args.image:
            print(f"\nthe base image through Ray's object store: {image_shipping()}")
    finally:
        local.close()
        ray.shutdown()
        cluster.shutdown()
    print(f"\nat end: {load_line()}")


async def tasks_section(base: str, args: argparse.Namespace) -> None:
    task_times: list[float] = []
    for run in range(args.pairs + 1):
        started = time.monotonic()
        answer, _, _ = await rollout_in_task.options(resources={SLOT_RESOURCE: 1}).remote(
            oracle(f"task-{run}").model_dump_json(), base
        )
        check(RolloutResult.model_validate_json(answer))
        if run:
            task_times.append(time.monotonic() - started)
    print(f"\none Ray task per rollout (a backend made per task): wall s {mean_ci(task_times)}")
    workers, rss = await task_processes(base, args.slots)
    print(f"{args.slots} rollouts at once as tasks: {workers} worker processes, mean RSS {rss:.0f} MiB each")


async def scaling_section(cluster: Cluster, config: NodeConfig, args: argparse.Namespace) -> None:
    one = RayRollouts(cluster.address, node_config=config)
    await one.start()
    await throughput(one, args.slots)  # warm-up
    one_node = await throughput(one, args.batch)
    add_node(cluster, args.slots, lean=not args.ray_defaults)
    await one.start()
    await throughput(one, args.slots)
    two_nodes = await throughput(one, args.batch)
    await one.close()
    print(f"\nrollouts/min, a batch of {args.batch}, {args.slots} slots per node, both nodes on this machine's cores")
    print(f"1 node: {one_node:6.1f}\n2 nodes: {two_nodes:5.1f}   ratio {two_nodes / one_node:.2f}")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="interleaved rollouts each way (default 20)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--ray-defaults", action="store_true", help="start the cluster with Ray's own defaults")
    parser.add_argument("--real", type=int, default=0, help="add: this many pairs of real OpenCode rollouts")
    parser.add_argument("--tasks", action="store_true", help="add: one Ray task per rollout")
    parser.add_argument("--scaling", action="store_true", help="add: one node against two (one machine's cores)")
    parser.add_argument("--batch", type=int, default=8, help="--scaling's batch")
    parser.add_argument("--image", action="store_true", help="add: the base image through the object store")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
