"""Packed per-token arrays (schema_version 4): lossless, bit for bit, with the lists in Python; a turn the layout
cannot hold travels as lists; version 3's lists still parse."""

from __future__ import annotations

import json
import math
from array import array

import pytest

from opencode_env.wire import UNPACKED_CONTEXT, RolloutResult, RolloutTurn


def turn(number: int, logprobs: list[float], texts: list[str] | None = None) -> RolloutTurn:
    ids = [100 + i for i in range(len(logprobs))]
    texts = texts or [f"<{i}>" for i in ids]
    top = [
        [(t, lp, i), ("alt", lp * 2, 7), (" b", -math.inf, 8)] for t, lp, i in zip(texts, logprobs, ids, strict=True)
    ]
    return RolloutTurn(
        turn=number, completion_token_ids=ids, completion_tokens=texts, per_token_logps=logprobs, top_logprobs=top
    )


def bits(values: list[float]) -> bytes:
    return array("d", values).tobytes()


def wire_turns(result: RolloutResult) -> list[dict[str, object]]:
    turns: list[dict[str, object]] = json.loads(result.model_dump_json())["proxy_turns"]
    return turns


def test_float32_and_float64_logprobs_round_trip_bit_for_bit() -> None:
    as_f32 = [*array("f", [-0.1, -2.5e-7, -13.75, 0.0]).tolist(), -math.inf, math.nan]
    as_f64 = [-0.123456789012345, -1e-300, -5.0]
    result = RolloutResult(proxy_turns=[turn(0, as_f32), turn(1, as_f64)])
    wire = wire_turns(result)
    assert [t["packed"]["float"] for t in wire] == ["f32", "f64"]  # type: ignore[index]
    assert all(t["completion_token_ids"] == [] and t["top_logprobs"] == [] for t in wire)
    parsed = RolloutResult.model_validate_json(result.model_dump_json())
    for got, want in zip(parsed.proxy_turns, result.proxy_turns, strict=True):
        assert got.completion_token_ids == want.completion_token_ids
        assert got.completion_tokens == want.completion_tokens
        assert bits(got.per_token_logps) == bits(want.per_token_logps)
        assert [[(t, i) for t, _, i in p] for p in got.top_logprobs] == [
            [(t, i) for t, _, i in p] for p in want.top_logprobs
        ]
        assert bits([lp for p in got.top_logprobs for _, lp, _ in p]) == bits(
            [lp for p in want.top_logprobs for _, lp, _ in p]
        )
        assert got.packed is None


def test_each_text_is_written_once_per_result() -> None:
    first, second = turn(0, [-1.0, -2.0]), turn(1, [-1.0, -2.0])
    wire = wire_turns(RolloutResult(proxy_turns=[first, second]))
    assert wire[0]["packed"]["vocab"] == ["<100>", "<101>", "alt", " b"]  # type: ignore[index]
    assert wire[1]["packed"]["vocab"] == []  # type: ignore[index]
    assert RolloutResult.model_validate_json(
        json.dumps({"task_id": "t", "status": "completed", "reward": 1.0, "proxy_turns": wire})
    ).proxy_turns[1].completion_tokens == [
        "<100>",
        "<101>",
    ]


def test_a_turn_the_layout_cannot_hold_travels_as_lists() -> None:
    odd = turn(0, [-1.0, -2.0])
    odd.top_logprobs[1] = odd.top_logprobs[1][:2]
    no_id = turn(1, [-1.0])
    no_id.top_logprobs[0][1] = ("alt", -2.0, None)
    two_texts = turn(2, [-1.0, -2.0], texts=["a", "b"])
    two_texts.top_logprobs[0][1] = ("not alt", -2.0, 101)
    result = RolloutResult(proxy_turns=[odd, no_id, two_texts])
    wire = wire_turns(result)
    assert [t["packed"] for t in wire] == [None, None, None]
    assert RolloutResult.model_validate_json(result.model_dump_json()).proxy_turns == result.proxy_turns


def test_version_3_lists_still_parse_and_can_still_be_written() -> None:
    result = RolloutResult(proxy_turns=[turn(0, [-0.5, -1.5])])
    old = json.loads(result.model_dump_json(context={UNPACKED_CONTEXT: True}))
    old["schema_version"] = 3
    assert old["proxy_turns"][0]["completion_token_ids"] == [100, 101]
    assert old["proxy_turns"][0]["packed"] is None
    assert RolloutResult.model_validate(old).proxy_turns == result.proxy_turns


def test_a_turn_with_both_packed_and_lists_is_refused() -> None:
    wire = wire_turns(RolloutResult(proxy_turns=[turn(0, [-0.5])]))
    wire[0]["completion_token_ids"] = [1]
    with pytest.raises(ValueError, match="packed and completion_token_ids exclude each other"):
        RolloutResult.model_validate({"proxy_turns": wire})
