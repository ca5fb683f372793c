"""The result's wire shape: results written by earlier code keep parsing, and the compact shape round-trips."""

from __future__ import annotations

from pathlib import Path

from opencode_env.models import RolloutResult
from opencode_env.training import training_sequences

FIXTURES = Path(__file__).parent / "fixtures"
V0_DEMO = FIXTURES / "result_v0_demo.json"


def test_a_result_written_before_the_compact_shape_still_parses() -> None:
    result = RolloutResult.model_validate_json(V0_DEMO.read_bytes())
    assert (result.status, result.reward, len(result.proxy_turns)) == ("completed", 1.0, 3)
    first, second = result.proxy_turns[0], result.proxy_turns[1]
    assert second.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids
    assert result.turn_messages(2)[:2] == result.turn_messages(0)[:2]
    [sequence] = training_sequences(result).sequences
    last = result.proxy_turns[-1]
    assert sequence.prompt_ids + sequence.completion_ids == last.prompt_token_ids + last.completion_token_ids
