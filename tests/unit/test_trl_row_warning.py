"""The result's warning when its TRL row holds under 90% of its agent tokens: how much, why, and the fix."""

from __future__ import annotations

from opencode_env.training.sequences import trl_row_warning
from opencode_env.wire import RolloutResult, RolloutTurn


def turn(number: int, prompt: list[int], completion: list[int], **fields: object) -> RolloutTurn:
    return RolloutTurn.model_validate(
        {
            "turn": number,
            "kind": "agent",
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "per_token_logps": [-0.5] * len(completion),
            "aligned": True,
            "finish_reason": "stop",
            "request": {"messages": [{"role": "user", "content": "go"}] + [{"role": "tool", "content": "x"}] * number},
            **fields,
        }
    )


def test_a_rollout_that_forks_at_every_turn_says_so_with_the_fix() -> None:
    turns = [
        turn(0, [1, 2], [10, 11, 12, 13]),
        turn(1, [1, 3, 4], [20, 21, 22, 23], token_in_fallback="the server takes no prompt ids"),
        turn(2, [1, 5, 6], [30]),
    ]
    warning = trl_row_warning(RolloutResult(status="completed", proxy_turns=turns))
    assert warning is not None
    assert warning.startswith("the TRL row holds 1 of 9 agent tokens (11.1%, 1 of 3 turns)")
    assert "2 fork(s) where the chat template's prompt did not extend the last turn" in warning
    assert "token-in fell back: the server takes no prompt ids" in warning
    assert "token_in='auto'" in warning


def test_a_row_that_extends_every_turn_says_nothing() -> None:
    turns = [turn(0, [1, 2], [10, 11]), turn(1, [1, 2, 10, 11, 7], [20]), turn(2, [1, 2, 10, 11, 7, 20, 8], [30])]
    assert trl_row_warning(RolloutResult(status="completed", proxy_turns=turns)) is None


def test_a_rollout_that_failed_on_our_side_or_has_no_ids_is_left_to_its_other_warnings() -> None:
    forked = [turn(0, [1, 2], [10, 11, 12, 13]), turn(1, [1, 3], [20])]
    assert trl_row_warning(RolloutResult(status="sandbox_error", proxy_turns=forked)) is None
    no_ids = [turn(0, [], [], completion_tokens=["a"]), turn(1, [], [], completion_tokens=["b"])]
    assert trl_row_warning(RolloutResult(status="completed", proxy_turns=no_ids)) is None
