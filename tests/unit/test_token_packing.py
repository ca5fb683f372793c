"""Packed per-token arrays (schema_version 4, and 5 with ranks): lossless, bit for bit, with the lists in Python; a
turn the layout cannot hold travels as lists; version 3's lists and version 4's packing still parse."""

from __future__ import annotations

import base64
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


def ranked_turn(number: int) -> RolloutTurn:
    """Positions whose sampled token is its first, its third or none of its alternatives, one whose id is there with
    another logprob, -0.0 against 0.0, and NaN (which never matches, whatever its bits)."""
    rows = [
        (11, -0.25, [(11, -0.25), (12, -1.0), (13, -2.0)]),
        (13, -2.0, [(11, -0.25), (12, -1.0), (13, -2.0)]),
        (14, -3.0, [(11, -0.25), (12, -1.0), (13, -2.0)]),
        (12, -0.5, [(12, -0.75), (11, -1.0), (13, -2.0)]),
        (11, -0.0, [(11, 0.0), (12, -1.0), (13, -2.0)]),
        (13, math.nan, [(13, math.nan), (12, -1.0), (11, -2.0)]),
    ]
    return RolloutTurn(
        turn=number,
        completion_token_ids=[token_id for token_id, _, _ in rows],
        completion_tokens=[f"<{token_id}>" for token_id, _, _ in rows],
        per_token_logps=[logprob for _, logprob, _ in rows],
        top_logprobs=[[(f"<{i}>", lp, i) for i, lp in alternatives] for _, _, alternatives in rows],
    )


def test_a_sampled_token_among_its_alternatives_travels_as_its_rank_and_comes_back_bit_for_bit() -> None:
    result = RolloutResult(proxy_turns=[ranked_turn(0)])
    packed = wire_turns(result)[0]["packed"]
    assert isinstance(packed, dict)
    assert array("b", base64.b64decode(packed["sampled_rank"])).tolist() == [0, 2, -1, -1, -1, -1]
    assert array("i", base64.b64decode(packed["ids"])).tolist() == [14, 12, 11, 13]
    parsed = RolloutResult.model_validate_json(result.model_dump_json()).proxy_turns[0]
    want = result.proxy_turns[0]
    assert parsed.completion_token_ids == want.completion_token_ids
    assert parsed.completion_tokens == want.completion_tokens
    assert bits(parsed.per_token_logps) == bits(want.per_token_logps)
    assert bits([lp for p in parsed.top_logprobs for _, lp, _ in p]) == bits(
        [lp for p in want.top_logprobs for _, lp, _ in p]
    )


def test_ranks_save_a_sampled_tokens_id_and_logprob_where_they_apply() -> None:
    greedy = RolloutTurn(
        turn=0,
        completion_token_ids=list(range(100, 1100)),
        completion_tokens=[f"<{i}>" for i in range(100, 1100)],
        per_token_logps=[-0.5] * 1000,
        top_logprobs=[[(f"<{i}>", -0.5, i), ("<7>", -1.5, 7)] for i in range(100, 1100)],
    )
    packed = wire_turns(RolloutResult(proxy_turns=[greedy]))[0]["packed"]
    assert isinstance(packed, dict)
    assert packed["ids"] == packed["logprobs"] == ""
    assert len(base64.b64decode(packed["sampled_rank"])) == 1000


def test_a_rank_outside_the_alternatives_is_refused() -> None:
    wire = wire_turns(RolloutResult(proxy_turns=[ranked_turn(0)]))
    packed = wire[0]["packed"]
    assert isinstance(packed, dict)
    packed["sampled_rank"] = base64.b64encode(array("b", [0, 3, -1, -1, -1, -1]).tobytes()).decode()
    with pytest.raises(ValueError, match=r"packed.sampled_rank: a rank outside -1..2"):
        RolloutResult.model_validate({"task_id": "t", "status": "completed", "reward": 1.0, "proxy_turns": wire})


def test_version_4_packed_turns_without_ranks_still_parse() -> None:
    want = ranked_turn(0)
    version_4 = {
        "count": 6,
        "top_k": 3,
        "float": "f64",
        "ids": base64.b64encode(array("i", want.completion_token_ids).tobytes()).decode(),
        "logprobs": base64.b64encode(array("d", want.per_token_logps).tobytes()).decode(),
        "top_ids": base64.b64encode(array("i", [i for p in want.top_logprobs for _, _, i in p]).tobytes()).decode(),
        "top_logprobs": base64.b64encode(
            array("d", [lp for p in want.top_logprobs for _, lp, _ in p]).tobytes()
        ).decode(),
        "vocab_ids": base64.b64encode(array("i", [11, 13, 14, 12]).tobytes()).decode(),
        "vocab": ["<11>", "<13>", "<14>", "<12>"],
    }
    wire = {"task_id": "t", "status": "completed", "reward": 1.0, "schema_version": 4}
    parsed = RolloutResult.model_validate({**wire, "proxy_turns": [{"turn": 0, "packed": version_4}]}).proxy_turns[0]
    assert parsed.completion_token_ids == want.completion_token_ids
    assert bits(parsed.per_token_logps) == bits(want.per_token_logps)
