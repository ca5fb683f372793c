"""The server's rollout slots among callers (`server.fair_slots`), over generated sequences of calls entering and
leaving: never more slots held than there are, nor by a capped caller than its cap; a free slot never idles while a
call that may take it waits; each slot goes to the waiting caller that holds the fewest (the longest waiting among
equals); a caller's waiting calls past its share are refused at once, naming the setting."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.server.fair_slots import FairSlots, OverShare, Ticket

CALLERS = ("hostile", "honest", "third", "operator")
Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("enter"), st.integers(0, len(CALLERS) - 1)),
        st.tuples(st.just("leave"), st.integers(0, 10_000)),
    ),
    max_size=80,
)


def eligible_waiters(slots: FairSlots, live: list[Ticket]) -> list[Ticket]:
    waiting = [ticket for ticket in live if not ticket.granted.done()]
    return [ticket for ticket in waiting if not ticket.capped or slots.held[ticket.caller] < slots.per_caller]


def check(slots: FairSlots, live: list[Ticket], granted: list[Ticket], before: dict[str, int]) -> None:
    held = {caller: sum(1 for t in live if t.caller == caller and t.granted.done()) for caller in CALLERS}
    assert sum(held.values()) <= slots.limit
    assert all(held[caller] == slots.held[caller] for caller in CALLERS)
    assert all(held[caller] <= slots.per_caller for caller in CALLERS if caller != "operator")
    assert slots.free == 0 or not eligible_waiters(slots, live), "a free slot idles while a call may take it"
    assert len(granted) <= 1
    for ticket in granted:
        for other in eligible_waiters(slots, live):
            if other.caller == ticket.caller:
                continue
            # Nobody still waiting held fewer than the caller served, nor as few with an earlier call.
            assert (before[ticket.caller], ticket.order) <= (before[other.caller], other.order)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 5),
    per_caller=st.integers(0, 5),
    queued=st.integers(1, 6),
    script=steps,
)
def test_slots_are_shared_fairly_over_any_sequence(
    limit: int, per_caller: int, queued: int, script: list[Step]
) -> None:
    async def play() -> None:
        slots = FairSlots(limit, per_caller=per_caller, queued_per_caller=queued)
        live: list[Ticket] = []
        for action, index in script:
            before = {caller: slots.held[caller] for caller in CALLERS}
            granted_before = {id(t) for t in live if t.granted.done()}
            if action == "enter":
                caller = CALLERS[index]
                capped = caller != "operator"
                waiting = sum(1 for t in live if t.caller == caller and not t.granted.done())
                if capped and waiting >= queued:
                    with pytest.raises(OverShare, match="OPENCODE_ENV_QUEUED_PER_CALLER"):
                        slots.enter(caller, capped=capped)
                    continue
                live.append(slots.enter(caller, capped=capped))
            elif live:
                gone = live.pop(index % len(live))
                if gone.granted.done():
                    before[gone.caller] -= 1
                gone.leave()
                gone.leave()
            granted = [t for t in live if t.granted.done() and id(t) not in granted_before]
            check(slots, live, granted, before)

    asyncio.run(play())


async def test_a_waiting_caller_gets_the_next_slot_before_one_that_queued_forty() -> None:
    slots = FairSlots(2)
    hostile = [slots.enter("hostile") for _ in range(42)]
    assert [t.granted.done() for t in hostile[:2]] == [True, True]
    honest = slots.enter("honest")
    assert not honest.granted.done()
    hostile[0].leave()
    assert honest.granted.done(), "the slot went to the caller holding none"
    assert not hostile[2].granted.done()
    await honest.acquire()
    honest.leave()
    assert hostile[2].granted.done()


async def test_alone_a_caller_uses_every_slot_and_a_cap_holds_it_back_while_slots_idle() -> None:
    alone = FairSlots(4)
    assert all(alone.enter("only").granted.done() for _ in range(4))
    capped = FairSlots(4, per_caller=1)
    first, second = capped.enter("only"), capped.enter("only")
    assert (first.granted.done(), second.granted.done(), capped.free) == (True, False, 3)
    operator = [capped.enter("operator", capped=False) for _ in range(3)]
    assert all(ticket.granted.done() for ticket in operator)


async def test_a_cancelled_wait_holds_no_slot_and_leaves_no_place() -> None:
    slots = FairSlots(1)
    holder = slots.enter("a")
    waiter = slots.enter("b")
    waiting = asyncio.ensure_future(waiter.acquire())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert slots.waiting("b") == 0
    holder.leave()
    assert (slots.free, dict(slots.held)) == (1, {})
