"""The one first-come-first-served reservation queue under both admissions (sandbox/reservations.py), over generated
runs of requests, cancellations and releases: never over capacity, in order, and nothing held once all is done."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.sandbox.reservations import Reservations

STEP = st.tuples(st.integers(1, 5), st.sampled_from(["keep", "cancel", "cancel_on_turn"]))


@given(capacity=st.integers(1, 8), steps=st.lists(STEP, max_size=16))
@settings(max_examples=120, deadline=None)
def test_never_over_capacity_first_come_first_served_and_nothing_left_held(
    capacity: int, steps: list[tuple[int, str]]
) -> None:
    async def run() -> None:
        queue = Reservations(capacity)
        order: list[int] = []
        tasks: list[tuple[int, str, asyncio.Task[None]]] = []

        async def take(index: int, units: int) -> None:
            await queue.reserve(units)
            order.append(index)
            assert queue.reserved <= capacity

        for index, (units, fate) in enumerate(steps):
            task = asyncio.create_task(take(index, min(units, capacity)))
            tasks.append((min(units, capacity), fate, task))
            await asyncio.sleep(0)
        for _units, fate, task in tasks:
            if fate == "cancel" and not task.done():
                task.cancel()
        for units, fate, task in tasks:
            if fate == "cancel_on_turn" and not task.done():
                queue.release(0)
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not task.cancelled():
                queue.release(units)
            assert queue.reserved <= capacity
        assert queue.reserved == 0
        assert order == sorted(order)

    asyncio.run(run())
