"""Rollouts spread over a simulated two-node Ray cluster: oracle runs, one real OpenCode run against the scripted
model, the order and streaming of results, the operator's niceness in the sandboxes, and a node removed under its
rollouts (infrastructure status, no reward, retried only when asked, its leftovers reaped by the next runner)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from opencode_env.cluster import NodeConfig, RayRollouts
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import is_infrastructure_failure
from tests.cluster.conftest import (
    NICE,
    SLOTS_PER_NODE,
    add_node,
    cgroups_named,
    loop_devices_for,
    mounts_under,
    oracle,
    pid_alive,
    trees,
)


async def test_oracle_rollouts_spread_over_the_nodes_in_request_order(rollouts: RayRollouts) -> None:
    requests = [oracle(f"oracle-{index}", seconds=2) for index in range(2 * SLOTS_PER_NODE)]
    results = await rollouts.run_rollouts(requests, progress=False)
    assert [result.task_id for result in results] == [request.task_id for request in requests]
    assert [(result.status, result.reward) for result in results] == [("completed", 1.0)] * len(requests)
    assert {result.files["nice.txt"] for result in results} == {f"{NICE}\n"}
    reports = await rollouts.nodes()
    assert len(reports) == 2
    assert {report.nice for report in reports} == {NICE}
    assert all(report.opencode for report in reports)


async def test_ray_runs_its_workers_at_15_and_the_runner_undoes_it(rollouts: RayRollouts) -> None:
    @ray.remote(num_cpus=0)
    def worker_nice() -> int:
        return os.nice(0)

    assert await worker_nice.remote() == 15
    assert {report.nice for report in await rollouts.nodes()} == {NICE}


async def test_ray_runs_async_actors_on_uvloop_and_the_runner_on_the_standard_loop(rollouts: RayRollouts) -> None:
    @ray.remote(num_cpus=0)
    class LoopProbe:
        async def event_loop(self) -> str:
            return type(asyncio.get_running_loop()).__module__

    assert (await LoopProbe.remote().event_loop.remote()).startswith("uvloop")  # type: ignore[attr-defined]
    assert {report.event_loop for report in await rollouts.nodes()} == {"asyncio"}


async def test_stream_yields_each_result_as_it_finishes_or_in_order_when_asked(rollouts: RayRollouts) -> None:
    # The slow one's head start must outlast a whole quick rollout on a busy machine (6 s did not, at load ~15).
    slow, quick = oracle("slow", seconds=20), oracle("quick")
    finished = [index async for index, _ in rollouts.stream([slow, quick])]
    assert finished == [1, 0]
    ordered = [(index, result.task_id) async for index, result in rollouts.stream([slow, quick], ordered=True)]
    assert ordered == [(0, "slow"), (1, "quick")]


@pytest.mark.timeout(900)
async def test_a_real_opencode_rollout_on_the_cluster(rollouts: RayRollouts) -> None:
    """The demo's 120 s agent limit is the demo's; here OpenCode's start shares two cores with the cluster (and
    whatever else the machine runs), so the agent gets the request's default limit."""
    with ScriptedModelServer(demo_script()) as model:
        request = demo_request(model.base_url, task_id="demo-on-ray", agent_timeout_s=600)
        result = await rollouts.run_rollout(request)
        calls = len(model.exchanges)
    assert (result.status, result.reward, result.oracle) == ("completed", 1.0, False), (
        result.error,
        calls,
        result.timings,
        result.agent_log_tail[-1500:],
        result.proxy_log_tail[-800:],
    )
    assert calls == len(result.proxy_turns) > 0
    assert all(turn.completion_token_ids for turn in result.proxy_turns)
    assert all(len(turn.per_token_logps) == len(turn.completion_token_ids) for turn in result.proxy_turns)


async def _running(driver: RayRollouts, count: int, base: Path, before: set[str]) -> None:
    """Until `count` rollouts are in flight across the nodes (each node counts its own), each with its tree made."""
    while (  # noqa: ASYNC110 (polls other processes)
        sum(report.in_flight for report in await driver.nodes()) < count or len(trees(base) - before) < count
    ):
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("retries", [0, 1])
async def test_a_node_removed_mid_rollout_is_infrastructure_never_reward(
    cluster: Cluster, cluster_base: Path, rollouts: RayRollouts, retries: int
) -> None:
    """A node joins, every slot gets a rollout that sleeps, the new node is removed under its two: they come back as
    infrastructure failures with no reward (or, with retries, as new samples run on a surviving node, saying so),
    the others complete; no hang. The surviving runners' periodic reaper takes what the dead node left (trees,
    mounts, cgroups, loop devices) without any new rollout."""
    survivors = rollouts.slots
    victim = add_node(cluster)
    await rollouts.start()
    assert rollouts.slots == survivors + SLOTS_PER_NODE
    victim_pid = next(r.pid for r in await rollouts.nodes() if r.node_id == victim.node_id)  # type: ignore[attr-defined]
    before = trees(cluster_base)
    requests = [oracle(f"removed-{retries}-{index}", seconds=20) for index in range(rollouts.slots)]
    batch = asyncio.ensure_future(rollouts.run_rollouts(requests, progress=False, retries=retries))
    await asyncio.wait_for(_running(rollouts, len(requests), cluster_base, before), 120)
    during = trees(cluster_base) - before
    cluster.remove_node(victim, allow_graceful=False)
    results = await asyncio.wait_for(batch, 300)

    lost = [result for result in results if result.status != "completed"]
    if retries:
        assert lost == []
        retried = [result for result in results if result.warnings and result.warnings[0].startswith("retry:")]
        assert len(retried) == SLOTS_PER_NODE
        assert all("a new sample" in result.warnings[0] for result in retried)
        assert all(result.reward == 1.0 for result in results)
    else:
        assert len(lost) == SLOTS_PER_NODE
        assert all(is_infrastructure_failure(result.status) and result.reward is None for result in lost)
        assert all("the node died" in (result.error or "") for result in lost)
        assert all(result.task is not None and result.task.api_key == "" for result in lost)
        completed = [result for result in results if result.status == "completed"]
        assert [result.reward for result in completed] == [1.0] * survivors
    assert rollouts.slots == survivors
    assert not pid_alive(victim_pid)

    await asyncio.wait_for(_reaped(rollouts, during, cluster_base), 60)
    reaped = {name for report in await rollouts.nodes() for name in report.reaped} & during
    # each of the dead node's rollouts left its agent's box and, once made beside it, its grader's box; the
    # survivors' rollouts closed theirs themselves (their rewards above would show a tree reaped from under them)
    assert SLOTS_PER_NODE <= len(reaped) <= 2 * SLOTS_PER_NODE, "the survivors' reaper took the dead node's trees"
    assert during & trees(cluster_base) == set()
    assert mounts_under(cluster_base) == []
    assert cgroups_named(during) == []
    assert loop_devices_for(during) == []


async def _reaped(driver: RayRollouts, names: set[str], base: Path) -> None:
    """Until the live nodes' periodic reapers (every 2 s in this tier) have taken a dead node's share of `names`
    and none of `names` is left on disk."""
    while (  # noqa: ASYNC110
        len({name for report in await driver.nodes() for name in report.reaped} & names) < SLOTS_PER_NODE
        or names & trees(base)
    ):
        await asyncio.sleep(0.5)


def test_node_config_refuses_a_niceness_out_of_range() -> None:
    with pytest.raises(ValueError, match="nice"):
        NodeConfig(nice=40)
