"""The one fan-out every runner's `run_rollouts` uses (wire/fan_out.py): results in request order, never more than
the bound at once, each lane opened once, and a lane's failure either raised (cancelling the others) or a result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.fan_out import RunOne, concurrency_of, fan_out, lane_of


def requests(count: int) -> list[RolloutRequest]:
    return [RolloutRequest(instruction="x", task_id=f"t{index}") for index in range(count)]


class Counted:
    """A runner that records how many of its rollouts overlap; each yields `delays[i]` times to the loop."""

    def __init__(self, delays: list[int]) -> None:
        self.delays, self.running, self.most = delays, 0, 0

    async def run(self, request: RolloutRequest) -> RolloutResult:
        self.running += 1
        self.most = max(self.most, self.running)
        for _ in range(self.delays[int(request.task_id[1:])]):
            await asyncio.sleep(0)
        self.running -= 1
        return RolloutResult(task_id=request.task_id, status="completed")


@given(delays=st.lists(st.integers(0, 5), max_size=12), bound=st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_results_come_back_in_request_order_within_the_bound(delays: list[int], bound: int) -> None:
    runner = Counted(delays)
    results = asyncio.run(fan_out(requests(len(delays)), lane_of(runner.run), concurrency=bound, progress=False))
    assert [result.task_id for result in results] == [f"t{index}" for index in range(len(delays))]
    assert runner.most <= bound


async def test_each_lane_is_opened_once_and_a_lane_that_fails_leaves_its_requests_to_the_others() -> None:
    opened: list[int] = []

    @asynccontextmanager
    async def lane() -> AsyncIterator[RunOne]:
        opened.append(len(opened))
        if len(opened) == 1:
            raise OSError("session refused")

        async def run(request: RolloutRequest) -> RolloutResult:
            await asyncio.sleep(0)
            return RolloutResult(task_id=request.task_id, status="completed")

        yield run

    def unrun(request: RolloutRequest, error: BaseException | None) -> RolloutResult:
        return RolloutResult(task_id=request.task_id, status="internal_error", error=repr(error))

    results = await fan_out(requests(5), lane, concurrency=3, progress=False, unrun=unrun)
    assert opened == [0, 1, 2]
    assert [result.status for result in results] == ["completed"] * 5


async def test_without_unrun_the_first_failure_is_raised_and_the_other_lanes_are_cancelled() -> None:
    cancelled: list[str] = []

    async def run(request: RolloutRequest) -> RolloutResult:
        if request.task_id == "t0":
            raise RuntimeError("no sandbox")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(request.task_id)
            raise
        return RolloutResult(task_id=request.task_id)

    with pytest.raises(RuntimeError, match="no sandbox"):
        await fan_out(requests(3), lane_of(run), concurrency=3, progress=False)
    await asyncio.sleep(0)
    assert sorted(cancelled) == ["t1", "t2"]


def test_a_bound_below_one_is_named() -> None:
    with pytest.raises(ValueError, match="max_concurrency must be at least 1, got 0"):
        concurrency_of(0, 4)
    assert concurrency_of(None, 4) == 4
