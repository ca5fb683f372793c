"""The driver: rollouts on a Ray cluster, a runner (wire/runner.py) like the client and `InProcess`, so a trainer
swaps the runner, not its code.

    async with RayRollouts("auto") as cluster:               # was: async with OpenCodeEnv(base_url=url) as env:
        results = await cluster.run_rollouts(group)           # same call, same list of results in request order

One runner (node.py) per node that advertises `opencode_env_slots`, pinned to it and holding all of the node's slots
(so two drivers never oversubscribe a node), prepared once before its first rollout. The driver hands each rollout to
the live node with the most free slots. Ray's own retries are off (a re-run is a second sample): a rollout whose
node dies comes back with an infrastructure status and no reward, or, where the caller asked for retries and its
deadline has time left, runs again from the start on another node and says so in its warnings."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from opencode_env.cluster.capacity import SLOT_RESOURCE
from opencode_env.cluster.faults import NodeFault, failed_on_cluster, marked_as_retry
from opencode_env.cluster.node import (
    LEAN_RAY_ENV,
    LEAN_SYSTEM_CONFIG,
    RUNNER_ENV,
    NodeConfig,
    NodeReport,
    NodeRunner,
)
from opencode_env.wire import RolloutRequest, RolloutResult, RunnerCapabilities, total_budget_s
from opencode_env.wire.fan_out import concurrency_of, fan_out, lane_of

log = logging.getLogger("opencode_env.cluster")
DRIVER_MARGIN_S = 120.0
"""Beyond a rollout's own deadline before the driver gives up on its node (the pipeline ends itself before)."""
NODE_LOST = (
    ray.exceptions.RayActorError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.LocalRayletDiedError,
)
RemoteRunner = ray.remote(NodeRunner)


class ClusterError(Exception):
    """The cluster cannot run rollouts at all (no node advertises slots, or none could be prepared)."""


@dataclass
class _Node:
    node_id: str
    slots: int
    runner: Any
    free: int
    alive: bool = True

    @property
    def short(self) -> str:
        return self.node_id[:12]


class RayRollouts:
    """Rollouts on the Ray cluster at `address` ('auto': the one this machine belongs to; None: a local one)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = "auto",
        *,
        retries: int = 0,
        node_config: NodeConfig | None = None,
        prepare_timeout_s: float = 1800.0,
    ) -> None:
        """`retries`: how many times a rollout lost with its node runs again on another node (each retry is a new
        sample; 0, the default, returns the loss as an infrastructure failure). `node_config`: settings for every
        runner (default: each node's own environment). `prepare_timeout_s`: a node's setup (OpenCode, images)."""
        if retries < 0:
            raise ValueError(f"retries must be at least 0, got {retries}")
        self.address = address
        self.retries = retries
        self._config = node_config or NodeConfig()
        self._prepare_timeout_s = prepare_timeout_s
        self._nodes: dict[str, _Node] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turn_condition = asyncio.Condition()
        self._start_lock = asyncio.Lock()
        self._images: set[str] = set()

    async def __aenter__(self) -> RayRollouts:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _turn(self) -> asyncio.Condition:
        self._follow_the_loop()
        return self._turn_condition

    @property
    def _started(self) -> asyncio.Lock:
        self._follow_the_loop()
        return self._start_lock

    def _follow_the_loop(self) -> None:
        """One driver serves many event loops in turn (a sync `rollout_func` or `run_eval_sync` runs each call in a
        loop of its own): its lock and condition are the current loop's. No rollout of it is in flight between."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._turn_condition, self._start_lock = loop, asyncio.Condition(), asyncio.Lock()

    @property
    def slots(self) -> int:
        """Rollouts the live nodes run at once."""
        return sum(node.slots for node in self._nodes.values() if node.alive)

    @property
    def capabilities(self) -> RunnerCapabilities:
        """The live nodes' slots once started (`start`, `async with`, or the first rollout); 1 before."""
        live = [node for node in self._nodes.values() if node.alive]
        where = f"ray cluster {self.address or '(local)'}: {len(live)} nodes, {self.slots} slots"
        return RunnerCapabilities(max_concurrency=max(self.slots, 1), sandboxes="cluster", where=where)

    async def start(self) -> None:
        """Connect, and put a prepared runner on every node advertising slots that has none yet (call it again to
        take in nodes that joined since)."""
        async with self._started:
            if not ray.is_initialized():
                ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False, **_lean(self.address))
            await self._add_new_nodes()
        if not self.slots:
            raise ClusterError(
                f"no node of the Ray cluster advertises {SLOT_RESOURCE}: start each node with "
                '`ray start ... --resources "$(python -m opencode_env.cluster resources)"` (docs/cluster.md)'
            )

    async def _add_new_nodes(self) -> None:
        fresh = []
        for info in ray.nodes():  # type: ignore[no-untyped-call]
            slots = int(info.get("Resources", {}).get(SLOT_RESOURCE, 0))
            node_id = str(info["NodeID"])
            if info.get("Alive") and slots > 0 and node_id not in self._nodes:
                strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
                runner = RemoteRunner.options(
                    scheduling_strategy=strategy,
                    resources={SLOT_RESOURCE: slots},
                    num_cpus=0,
                    max_restarts=0,
                    max_task_retries=0,
                    max_concurrency=slots + 4,
                    runtime_env={"env_vars": dict(RUNNER_ENV)},
                ).remote(self._config, node_id)
                fresh.append(_Node(node_id, slots, runner, free=0))
        reports = await asyncio.gather(*(self._prepare(node) for node in fresh), return_exceptions=True)
        for node, report in zip(fresh, reports, strict=True):
            if isinstance(report, BaseException):
                log.warning("node %s could not be prepared, no rollout goes there: %s", node.short, report)
                ray.kill(node.runner, no_restart=True)
                continue
            node.free = node.slots
            self._nodes[node.node_id] = node
        async with self._turn:
            self._turn.notify_all()

    async def _prepare(self, node: _Node) -> NodeReport:
        report: NodeReport = await asyncio.wait_for(
            node.runner.prepare.remote(sorted(self._images)), self._prepare_timeout_s
        )
        return report

    async def prepare_images(self, images: Sequence[str]) -> list[NodeReport]:
        """Unpack these images on every live node before their rollouts (each node once)."""
        self._images.update(image for image in images if image)
        live = [node for node in self._nodes.values() if node.alive]
        outcomes = await asyncio.gather(*(self._prepare(node) for node in live), return_exceptions=True)
        return [outcome for outcome in outcomes if isinstance(outcome, NodeReport)]

    async def nodes(self) -> list[NodeReport]:
        """Each live node's report (niceness, rollouts in flight, what its reaper removed)."""
        live = [node for node in self._nodes.values() if node.alive]
        outcomes = await asyncio.gather(*(node.runner.report.remote() for node in live), return_exceptions=True)
        return [outcome for outcome in outcomes if isinstance(outcome, NodeReport)]

    async def _acquire(self) -> _Node | None:
        async with self._turn:
            while True:
                live = [node for node in self._nodes.values() if node.alive]
                if not live:
                    return None
                best = max(live, key=lambda node: node.free)
                if best.free > 0:
                    best.free -= 1
                    return best
                await self._turn.wait()

    async def _release(self, node: _Node, *, lost: bool) -> None:
        async with self._turn:
            if lost:
                node.alive = False
            else:
                node.free += 1
            self._turn.notify_all()

    async def run_rollout(
        self, request: RolloutRequest, *, partial: RolloutResult | None = None, retries: int | None = None
    ) -> RolloutResult:
        """One rollout on the cluster; never raises for a node's failure (see the module doc). `partial` is left as
        given: what a cancelled rollout captured stays on its node."""
        if not self._nodes:
            await self.start()
        allowed = self.retries if retries is None else retries
        started, faults = time.monotonic(), list[NodeFault]()
        while True:
            result, fault = await self._attempt(request, len(faults) + 1)
            if fault is None:
                return marked_as_retry(result, faults) if faults else result
            faults.append(fault)
            within_deadline = time.monotonic() - started < total_budget_s(request)
            if len(faults) > allowed or not within_deadline or not self.slots:
                return marked_as_retry(result, faults[:-1]) if len(faults) > 1 else result

    async def _attempt(self, request: RolloutRequest, attempt: int) -> tuple[RolloutResult, NodeFault | None]:
        node = await self._acquire()
        if node is None:
            fault = NodeFault(attempt=attempt, node="(none)", reason="no live node of the cluster runs rollouts")
            return failed_on_cluster(request, fault), fault
        call = node.runner.run.remote(request.model_dump_json())
        lost = False
        try:
            answer: str = await asyncio.wait_for(call, total_budget_s(request) + DRIVER_MARGIN_S)
            return RolloutResult.model_validate_json(answer), None
        except NODE_LOST as error:
            lost = True
            fault = NodeFault(attempt=attempt, node=node.short, reason=f"the node died ({type(error).__name__})")
            log.warning("node %s was lost under a rollout of %s: %s", node.short, request.task_id, error)
            return failed_on_cluster(request, fault), fault
        except TimeoutError:
            ray.cancel(call)
            fault = NodeFault(attempt=attempt, node=node.short, reason="no answer from the node within the deadline")
            return failed_on_cluster(request, fault, "timeout"), None
        except ray.exceptions.RayTaskError as error:
            fault = NodeFault(attempt=attempt, node=node.short, reason=f"the runner failed: {error}")
            return failed_on_cluster(request, fault, "internal_error"), None
        finally:
            await self._release(node, lost=lost)

    async def stream(
        self, requests: Sequence[RolloutRequest], *, ordered: bool = False, retries: int | None = None
    ) -> AsyncIterator[tuple[int, RolloutResult]]:
        """(index, result) of each request as it finishes, or, with `ordered`, in request order as soon as every
        earlier one has finished (a GRPO group handed on whole)."""
        await self.start()
        await self.prepare_images(sorted({request.image for request in requests if request.image}))
        running = {
            asyncio.ensure_future(self.run_rollout(request, retries=retries)): index
            for index, request in enumerate(requests)
        }
        held: dict[int, RolloutResult] = {}
        next_index, pending = 0, set(running)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in sorted(done, key=running.__getitem__):
                    if not ordered:
                        yield running[future], future.result()
                        continue
                    held[running[future]] = future.result()
                while next_index in held:
                    yield next_index, held.pop(next_index)
                    next_index += 1
        finally:
            for future in pending:
                future.cancel()

    async def run_rollouts(
        self,
        requests: Sequence[RolloutRequest],
        *,
        max_concurrency: int | None = None,
        progress: bool = True,
        retries: int | None = None,
    ) -> list[RolloutResult]:
        """The client's `run_rollouts` on the cluster: every result, in request order. `max_concurrency` caps the
        rollouts at once below the cluster's slots (None: all of them)."""
        concurrency = concurrency_of(max_concurrency, len(requests) or 1)

        async def run_one(request: RolloutRequest) -> RolloutResult:
            return await self.run_rollout(request, retries=retries)

        await self.start()
        await self.prepare_images(sorted({request.image for request in requests if request.image}))
        return await fan_out(requests, lane_of(run_one), concurrency=concurrency, progress=progress)

    async def reap(self) -> list[str]:
        """Run every live node's reaper now; the trees removed."""
        live = [node for node in self._nodes.values() if node.alive]
        outcomes = await asyncio.gather(*(node.runner.reap.remote() for node in live), return_exceptions=True)
        return [name for outcome in outcomes if isinstance(outcome, list) for name in outcome]

    async def close(self) -> None:
        """End this driver's runners (their rollouts are over by now; the connection to Ray stays)."""
        for node in self._nodes.values():
            if node.alive:
                ray.kill(node.runner, no_restart=True)
        self._nodes.clear()


def _lean(address: str | None) -> dict[str, Any]:
    """A local cluster this driver starts itself (address None) runs without what rollouts never use."""
    if address is not None:
        return {}
    for name, value in LEAN_RAY_ENV.items():
        os.environ.setdefault(name, value)
    return {"include_dashboard": False, "_system_config": dict(LEAN_SYSTEM_CONFIG)}
