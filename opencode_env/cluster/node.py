"""The runner on one node: a long-lived Ray actor that holds the node's local backend and runs its rollouts
concurrently in one event loop (as `opencode-env serve` would), prepared once before its first rollout.

On start it sets the niceness the operator chose for every thread of its process (Ray starts workers at nice 15 and
the sandboxes would inherit it), reaps what dead rollouts left on this machine (directories, mounts, loop disks,
cgroups: the local backend's own reaper), installs OpenCode and unpacks the images its rollouts will name; then it
reaps again every `reap_every_s`, so a node whose rollouts were killed with their worker is cleaned without waiting
for a later rollout. This module is plain Python: `executor.py` wraps the class with `ray.remote`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, Field

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.services import (
    HOST_IMAGE,
    ImageStore,
    LocalBackend,
    cache_root,
    cached_tools,
    default_image,
    image_exists,
    parse_trusted_hosts,
    reap_orphans,
)
from opencode_env.settings import Settings
from opencode_env.wire import RolloutRequest

log = logging.getLogger("opencode_env.cluster")

LEAN_RAY_START_FLAGS = ("--include-dashboard=false", "--include-log-monitor=false", "--disable-usage-stats")
"""What `ray start` runs by default that rollouts never use, turned off on every node (docs/cluster.md): the
dashboard (head), the log monitor (it ships workers' logs to drivers; ours start with log_to_driver=False) and
usage statistics. Measured in bench/ray_overhead.py."""
LEAN_RAY_ENV = {"RAY_enable_metrics_collection": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""The same for what only the environment turns off: the metrics every Ray process collects and exports."""
LEAN_NODE_ARGS = {"include_dashboard": False, "include_log_monitor": False}
"""The flags above as `ray.cluster_utils.Cluster.add_node` takes them (a simulated cluster: the tests, the bench)."""
LEAN_SYSTEM_CONFIG = {"enable_metrics_collection": False}
"""The metrics switch as a head node's `_system_config` (a local or simulated cluster started from Python)."""
RUNNER_ENV = {"RAY_USE_UVLOOP": "0"}
"""The runner's own worker environment (its actor's runtime_env): its event loop is the standard library's. Ray runs
async actors on uvloop where it is installed (the server extra installs it), and uvloop starts each subprocess with a
fork of the whole runner, which costs with the runner's size; the standard loop's spawn does not
(bench/ray_overhead.py, docs/cluster.md)."""


class NodeConfig(BaseModel):
    """What the operator sets for every node's runner, through the driver (the rest is each node's environment)."""

    nice: int = Field(0, ge=-20, le=19, description="The rollouts' niceness (Ray starts its workers at 15).")
    reap_every_s: float = Field(300.0, gt=0, description="How often each node reaps dead rollouts' leftovers.")
    base_dir: str | None = Field(None, description="Where sandboxes' trees go (default: the node's temp dir).")


class NodeReport(BaseModel):
    """What a runner says about itself: where it runs and what its setup and reaper did."""

    node_id: str
    hostname: str
    pid: int
    nice: int
    in_flight: int
    prepared_s: float
    opencode: str
    event_loop: str = Field("", description="The package of the event loop its rollouts run on (asyncio or uvloop).")
    images: dict[str, str] = Field(default_factory=dict, description="Each image prepared: its id, or why not.")
    reaped: list[str] = Field(default_factory=list, description="Leftover trees this runner reaped, oldest first.")
    cpu_s: float = Field(
        0.0,
        description="CPU seconds of this runner's process and of the children it waited for (the rollouts' "
        "sandboxes), since it started: a node's rollout work, apart from Ray's own processes.",
    )


def set_process_nice(nice: int) -> None:
    """Every thread of this process at `nice` (Linux keeps niceness per thread; children inherit their forking
    thread's). Lowering it below Ray's needs root, which the local backend needs anyway."""
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


class NodeRunner:
    """One per node (see the module doc); methods are called by the driver through Ray."""

    def __init__(self, config: NodeConfig, node_id: str) -> None:
        settings = Settings.load()
        self._settings = settings
        self._nice = config.nice
        self._reap_every_s = config.reap_every_s
        self._base_dir = Path(config.base_dir) if config.base_dir else None
        self._cache = cache_root(settings.cache)
        self._backend = LocalBackend(
            functools.partial(cached_tools, self._cache),
            base_dir=self._base_dir,
            image=settings.local_image,
            memory_overcommit=settings.memory_overcommit,
            egress_trusted_hosts=parse_trusted_hosts(settings.egress_trusted_hosts),
            cache_dir=self._cache,
        )
        self._report = NodeReport(
            node_id=node_id,
            hostname=os.uname().nodename,
            pid=os.getpid(),
            nice=0,
            in_flight=0,
            prepared_s=0,
            opencode="",
        )
        self._reaper: asyncio.Task[None] | None = None
        self._images: dict[str, str] = {}

    async def prepare(self, images: list[str]) -> NodeReport:
        """Set up this node once (niceness, reaper, OpenCode, images); a later call only prepares new images."""
        started = time.monotonic()
        if self._reaper is None:
            set_process_nice(self._nice)
            await self.reap()
            tools = await cached_tools(self._cache)
            self._report.opencode = tools.opencode or ""
            self._report.event_loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
            self._reaper = asyncio.get_running_loop().create_task(self._reap_periodically())
        default = await asyncio.to_thread(default_image, self._settings.local_image)
        for ref in dict.fromkeys([default, *images]):
            if ref and ref != HOST_IMAGE and ref not in self._images:
                self._images[ref] = await asyncio.to_thread(self._prepare_image, ref)
        self._report.prepared_s += round(time.monotonic() - started, 3)
        return self.report()

    def _prepare_image(self, ref: str) -> str:
        """Unpack `ref` into the node's image cache (the local backend then finds it unpacked), or say why not."""
        if not ref.startswith(("oci-archive:", "docker-archive:")) and not image_exists(ref):
            return "absent: not in this node's container storage (load or build it on the node, see docs/cluster.md)"
        try:
            return ImageStore(self._cache / "images").prepare(ref).image_id
        except (OSError, SandboxError) as error:
            return f"failed: {error}"

    async def run(self, request_json: str) -> str:
        """One rollout on this node; the result as JSON (it never raises, except on cancellation)."""
        request = RolloutRequest.model_validate_json(request_json)
        self._report.in_flight += 1
        try:
            result = await run_rollout(request, self._backend, settings=self._settings)
        finally:
            self._report.in_flight -= 1
        return result.model_dump_json()

    async def reap(self) -> list[str]:
        """Remove what rollouts whose process is gone left on this machine (their owner lock is free)."""
        reaped = await asyncio.to_thread(reap_orphans, self._base_dir)
        self._report.reaped.extend(reaped)
        return reaped

    def report(self) -> NodeReport:
        self._report.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self._report.images = dict(self._images)
        times = os.times()
        self._report.cpu_s = round(times.user + times.system + times.children_user + times.children_system, 3)
        return self._report.model_copy(deep=True)

    async def _reap_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._reap_every_s)
            try:
                await self.reap()
            except OSError as error:
                log.warning("the periodic reaper failed on this node: %s", error)
