"""Slots on a capped cloud account (`sandbox.cloud.admission`), over generated mixes of rollouts: a rollout graded
in the grader's box holds one slot while its agent runs and a second only for verify; every rollout ends (a
rollout holding its agent's slot while it waits for its grader's never starves, whatever the cap and the mix); the
slots held never pass the cap; a cap of N runs N - 1 such agents at once (two slots a rollout ran N // 2)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.sandbox.base import GraderBoxRole
from opencode_env.sandbox.cloud.admission import Admission


@dataclass
class Tally:
    limit: int
    held: int = 0
    agents: int = 0
    peak_agents: int = 0
    ended: int = 0

    def take(self, role: GraderBoxRole) -> None:
        self.held += 1
        self.agents += role == "planned"
        self.peak_agents = max(self.peak_agents, self.agents)
        assert self.held <= self.limit

    def give(self, role: GraderBoxRole) -> None:
        self.held -= 1
        self.agents -= role == "planned"


async def rollout(admission: Admission, tally: Tally, role: GraderBoxRole, agent_steps: int, verify_steps: int) -> None:
    await admission.acquire(role)
    tally.take(role)
    for _ in range(agent_steps):
        await asyncio.sleep(0)
    if role == "planned":
        await admission.acquire("this")
        tally.take("this")
        for _ in range(verify_steps):
            await asyncio.sleep(0)
        tally.give("this")
        admission.release("this")
    tally.give(role)
    admission.release(role)
    tally.ended += 1


async def run_all(limit: int, mix: list[tuple[bool, int, int]]) -> Tally:
    admission, tally = Admission(limit, stagger_s=0), Tally(limit)
    runs = [
        rollout(admission, tally, "planned" if graded_apart else "none", agent, verify)
        for graded_apart, agent, verify in mix
    ]
    # Only sleep(0) steps: a mix that could deadlock would leave the gather pending, not merely slow.
    await asyncio.wait_for(asyncio.gather(*runs), timeout=10)
    assert (admission.held, tally.held, tally.ended) == (0, 0, len(mix))
    return tally


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(2, 6),
    mix=st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=30),
)
def test_every_rollout_ends_and_the_cap_holds(limit: int, mix: list[tuple[bool, int, int]]) -> None:
    tally = asyncio.run(run_all(limit, mix))
    assert tally.peak_agents <= limit - 1


def test_a_cap_of_n_runs_n_minus_one_agents_graded_apart_at_once() -> None:
    for limit in (2, 4, 20):
        tally = asyncio.run(run_all(limit, [(True, 50, 1)] * (3 * limit)))
        assert tally.peak_agents == limit - 1, limit


def test_a_waiting_grader_goes_before_agents_that_came_earlier() -> None:
    """Cap 3: two agents hold their slots, a third waits for one; the grader of the first, asked later, takes the
    free slot first (else the first agent would wait behind the third, which waits for the first to end)."""

    async def scenario() -> list[str]:
        admission, order = Admission(3, stagger_s=0), []
        await admission.acquire("planned")
        await admission.acquire("planned")
        third = asyncio.ensure_future(admission.acquire("planned"))
        await asyncio.sleep(0)
        grader = asyncio.ensure_future(admission.acquire("this"))
        third.add_done_callback(lambda _: order.append("third agent"))
        grader.add_done_callback(lambda _: order.append("grader"))
        await asyncio.sleep(0.05)
        assert order == ["grader"]
        assert not third.done()
        admission.release("this")
        admission.release("planned")
        await asyncio.wait_for(third, timeout=5)
        return order

    assert asyncio.run(scenario()) == ["grader", "third agent"]


def test_others_wait_their_turn_behind_an_earlier_agent() -> None:
    """First come, first served among all but graders: a rollout graded in its own VM, asked after an agent that
    waits, is not served before it."""

    async def scenario() -> None:
        admission = Admission(3, stagger_s=0)
        await admission.acquire("planned")
        await admission.acquire("planned")
        agent = asyncio.ensure_future(admission.acquire("planned"))
        single = asyncio.ensure_future(admission.acquire("none"))
        await asyncio.sleep(0.05)
        assert not agent.done()
        assert not single.done()
        admission.release("planned")
        await asyncio.wait_for(asyncio.gather(agent, single), timeout=5)
        assert admission.held == 3

    asyncio.run(scenario())
