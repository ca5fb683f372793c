"""The cluster tier: a simulated Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and a worker node,
each a raylet of its own advertising its own slots), started once for the tier (it costs 18-34 s and ~880 MiB here).
Skipped whole when the ray extra is not installed; `./dev test` runs it as a stage of its own (-m cluster, -n 0)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

# Under `uv run`, Ray (2.45+) would have every worker start through `uv run` in a copy of the working dir, which
# installs the project without its extras (no ray: the worker cannot start). The nodes share this venv instead.
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from opencode_env.cluster import SLOT_RESOURCE, NodeConfig, RayRollouts  # noqa: E402
from opencode_env.sandbox.local.isolation.cgroup import CGROUP_ROOT, PARENT  # noqa: E402
from opencode_env.sandbox.local.layout import PREFIX  # noqa: E402
from opencode_env.wire import RolloutRequest  # noqa: E402

SLOTS_PER_NODE = 2
NICE = 0
"""The operator's niceness for the tier's sandboxes (the default): Ray's workers start at 15."""
WORKDIR = "/home/user/workdir"


CLUSTER_TEST_S = 600
"""Each test's time limit unless it sets its own: every one drives rollouts through Ray's processes and a simulated
cluster sharing this machine's cores, and at load ~15 an eval of a few oracle rollouts outlasted the suite's
default of 120 s (a quiet machine's)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.cluster)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(CLUSTER_TEST_S))


def add_node(cluster: Cluster, slots: int = SLOTS_PER_NODE) -> object:
    """A node of its own on this machine, advertising `slots` (a small object store: rollouts pass JSON only)."""
    return cluster.add_node(num_cpus=1, resources={SLOT_RESOURCE: slots}, object_store_memory=80 * 2**20)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    simulated = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "resources": {SLOT_RESOURCE: SLOTS_PER_NODE},
            "object_store_memory": 80 * 2**20,
        },
    )
    add_node(simulated)
    ray.init(address=simulated.address, log_to_driver=False)
    try:
        yield simulated
    finally:
        ray.shutdown()
        simulated.shutdown()


@pytest.fixture(scope="session")
def cluster_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tier's sandboxes' trees go: its own directory, so leftovers are ours to count."""
    return tmp_path_factory.mktemp("cluster-sandboxes")


@pytest.fixture(scope="module")
async def rollouts(cluster: Cluster, cluster_base: Path, opencode_binary: Path) -> AsyncIterator[RayRollouts]:
    """A driver on the tier's cluster, for one module (it holds every node's slots while it lives)."""
    config = NodeConfig(nice=NICE, base_dir=str(cluster_base), reap_every_s=2.0)
    async with RayRollouts(cluster.address, node_config=config) as driver:
        yield driver


def oracle(task_id: str, *, seconds: int = 0) -> RolloutRequest:
    """A task solved by its solution (no model), which notes the niceness it ran at and which node ran it."""
    solution = [f"echo 42 > {WORKDIR}/answer.txt", f"nice > {WORKDIR}/nice.txt"]
    if seconds:
        solution.insert(0, f"sleep {seconds}")
    return RolloutRequest.model_validate(
        {
            "instruction": "Write 42 to answer.txt",
            "task_id": task_id,
            "verify": [f'cd {WORKDIR} && test "$(cat answer.txt)" = 42'],
            "solution": solution,
        }
    )


def trees(base: Path) -> set[str]:
    return {path.name for path in base.glob(f"{PREFIX}*")}


def mounts_under(base: Path) -> list[str]:
    points = [line.split(" ")[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [point for point in points if point.startswith(str(base))]


def cgroups_named(names: set[str]) -> list[str]:
    """The rollouts' cgroups (their own and their proxy's), under every controller of either cgroup version."""
    found = []
    for name in names:
        found += [str(path) for path in CGROUP_ROOT.glob(f"*/{PARENT}/{name}*")]
        found += [str(path) for path in CGROUP_ROOT.glob(f"{PARENT}/{name}*")]
    return found


def loop_devices_for(names: set[str]) -> list[str]:
    backing = []
    for device in Path("/sys/block").glob("loop*"):
        file = device / "loop" / "backing_file"
        if file.exists() and any(name in file.read_text() for name in names):
            backing.append(device.name)
    return backing


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
