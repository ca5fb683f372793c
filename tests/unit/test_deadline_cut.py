"""Whose a verify the deadline cut short is: ours (no grade) only when verify never had the time its commands may
take once the grader's sandbox was ready; when it had, steps whose length the agent sets ate it (the agent's 0.0)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from opencode_env.rollout.commands import verify_had_room
from opencode_env.wire import RolloutRequest


@given(
    commands=st.integers(min_value=1, max_value=5),
    timeout_s=st.floats(min_value=1, max_value=3600),
    room_s=st.none() | st.floats(min_value=0, max_value=20_000),
)
def test_verify_had_room_when_every_command_fit(commands: int, timeout_s: float, room_s: float | None) -> None:
    request = RolloutRequest(instruction="x", verify=["true"] * commands, verify_timeout_s=timeout_s)
    expected = room_s is not None and room_s >= commands * timeout_s
    assert verify_had_room(request, room_s) is expected


def test_a_room_just_short_of_the_last_command_is_ours() -> None:
    request = RolloutRequest(instruction="x", verify=["a", "b"], verify_timeout_s=30)
    assert verify_had_room(request, 60.0)
    assert not verify_had_room(request, 59.9)
    assert not verify_had_room(request, None)
