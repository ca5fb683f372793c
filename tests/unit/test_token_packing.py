"""Packed per-token arrays (schema_version 4, 5 with ranks, 6 with alternatives named by text): lossless, bit for
bit, with the lists in Python; a turn the layout cannot hold travels as lists; version 3's lists and version 4's and
5's packing still parse; a malformed packing is refused naming its field."""

from __future__ import annotations

import base64
import json
import math
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
        assert_same(got, want)
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
    two_texts = turn(1, [-1.0, -2.0], texts=["a", "b"])
    two_texts.top_logprobs[0][1] = ("not alt", -2.0, 101)
    minus_one = turn(2, [-1.0])
    minus_one.completion_token_ids = [-1]
    minus_one.top_logprobs[0][0] = ("<100>", -1.0, None)
    result = RolloutResult(proxy_turns=[odd, two_texts, minus_one])
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


def test_version_5_packed_turns_still_parse() -> None:
    want = ranked_turn(0)
    version_5 = {
        "count": 6,
        "top_k": 3,
        "float": "f64",
        "ids": base64.b64encode(array("i", [14, 12, 11, 13]).tobytes()).decode(),
        "logprobs": base64.b64encode(array("d", [-3.0, -0.5, -0.0, math.nan]).tobytes()).decode(),
        "top_ids": base64.b64encode(array("i", [i for p in want.top_logprobs for _, _, i in p]).tobytes()).decode(),
        "top_logprobs": base64.b64encode(
            array("d", [lp for p in want.top_logprobs for _, lp, _ in p]).tobytes()
        ).decode(),
        "sampled_rank": base64.b64encode(array("b", [0, 2, -1, -1, -1, -1]).tobytes()).decode(),
        "vocab_ids": base64.b64encode(array("i", [11, 13, 14, 12]).tobytes()).decode(),
        "vocab": ["<11>", "<13>", "<14>", "<12>"],
    }
    wire = {"task_id": "t", "status": "completed", "reward": 1.0, "schema_version": 5}
    parsed = RolloutResult.model_validate({**wire, "proxy_turns": [{"turn": 0, "packed": version_5}]}).proxy_turns[0]
    assert parsed.completion_token_ids == want.completion_token_ids
    assert parsed.completion_tokens == want.completion_tokens
    assert bits(parsed.per_token_logps) == bits(want.per_token_logps)
    assert parsed.top_logprobs[0] == want.top_logprobs[0]


def by_text_turn(number: int, rows: list[tuple[int, str, float, list[tuple[str, float, int | None]]]]) -> RolloutTurn:
    return RolloutTurn(
        turn=number,
        completion_token_ids=[token_id for token_id, _, _, _ in rows],
        completion_tokens=[text for _, text, _, _ in rows],
        per_token_logps=[logprob for _, _, logprob, _ in rows],
        top_logprobs=[list(alternatives) for _, _, _, alternatives in rows],
    )


def decoded(packed: dict[str, object], name: str, typecode: str) -> list[object]:
    value = packed[name]
    assert isinstance(value, str)
    return array(typecode, base64.b64decode(value)).tolist()


def assert_same(got: RolloutTurn, want: RolloutTurn) -> None:
    assert got.completion_token_ids == want.completion_token_ids
    assert got.completion_tokens == want.completion_tokens
    assert bits(got.per_token_logps) == bits(want.per_token_logps)
    assert [[(t, i) for t, _, i in p] for p in got.top_logprobs] == [
        [(t, i) for t, _, i in p] for p in want.top_logprobs
    ]
    assert bits([lp for p in got.top_logprobs for _, lp, _ in p]) == bits(
        [lp for p in want.top_logprobs for _, lp, _ in p]
    )


def test_alternatives_named_by_text_pack_into_a_text_table_written_once_per_result() -> None:
    """As vLLM streams them: the sampled token first among its alternatives, which carry a text and no id."""
    first = by_text_turn(
        0,
        [
            (11, " the", -0.25, [(" the", -0.25, None), (" a", -2.0, None), ("\n", -3.0, None)]),
            (12, " cat", -0.5, [(" cat", -0.5, None), (" the", -1.0, None), (" a", -2.0, None)]),
        ],
    )
    second = by_text_turn(1, [(13, " sat", -0.125, [(" sat", -0.125, None), (" cat", -4.0, None), ("\n", -5.0, None)])])
    result = RolloutResult(proxy_turns=[first, second])
    wire = wire_turns(result)
    packed = [t["packed"] for t in wire]
    assert all(isinstance(p, dict) for p in packed)
    assert [p["top_ids"] for p in packed] == ["", ""]
    assert [p["alt_texts"] for p in packed] == [[" the", " a", "\n", " cat"], [" sat"]]
    assert decoded(packed[0], "top_texts", "h") == [0, 1, 2, 3, 0, 1]
    assert decoded(packed[1], "top_texts", "h") == [4, 3, 2]
    assert [decoded(p, "sampled_rank", "b") for p in packed] == [[0, 0], [0]]
    assert [decoded(p, "ids", "i") for p in packed] == [[11, 12], [13]]
    assert [p["logprobs"] for p in packed] == ["", ""]
    parsed = RolloutResult.model_validate_json(result.model_dump_json())
    assert parsed.schema_version == 6
    for got, want in zip(parsed.proxy_turns, result.proxy_turns, strict=True):
        assert_same(got, want)
    assert parsed.proxy_turns == result.proxy_turns


def test_ids_hold_the_unranked_and_the_positions_ranked_to_an_alternative_without_an_id() -> None:
    """A mix: ranked to an alternative with an id (nothing kept), ranked to one without (the id kept, not the
    logprob), unranked (both kept); duplicate texts at one position, NaN and -0.0 never ranked against their
    look-alikes."""
    rows = [
        (5, "x", -1.0, [("x", -1.0, 5), ("y", -2.0, None)]),
        (6, "y", -2.0, [("x", -1.0, 5), ("y", -2.0, None)]),
        (7, "z", -3.0, [("x", -1.0, 5), ("y", -2.0, None)]),
        (8, "y", -2.0, [("y", -9.0, None), ("y", -2.0, None)]),
        (9, "w", -0.0, [("w", 0.0, None), ("w", -0.5, None)]),
        (9, "w", math.nan, [("w", math.nan, None), ("w", -0.5, 9)]),
    ]
    result = RolloutResult(proxy_turns=[by_text_turn(0, rows)])
    packed = wire_turns(result)[0]["packed"]
    assert isinstance(packed, dict)
    assert decoded(packed, "sampled_rank", "b") == [0, 1, -1, 1, -1, -1]
    assert decoded(packed, "ids", "i") == [6, 7, 8, 9, 9]
    assert bits(decoded(packed, "logprobs", "f")) == bits([-3.0, -0.0, math.nan])  # type: ignore[arg-type]
    assert decoded(packed, "top_ids", "i") == [5, -1, 5, -1, 5, -1, -1, -1, -1, -1, -1, 9]
    assert decoded(packed, "top_texts", "h") == [-1, 0, -1, 0, -1, 0, 0, 0, 1, 1, 1, -1]
    assert packed["alt_texts"] == ["y", "w"]
    assert_same(RolloutResult.model_validate_json(result.model_dump_json()).proxy_turns[0], result.proxy_turns[0])


def test_text_indices_are_int16_until_the_result_has_more_texts_than_int16_indexes() -> None:
    many = 2**15 + 1
    rows = [(1, "s", -0.5, [(f"t{i}", -1.0, None)]) for i in range(many)]
    result = RolloutResult(proxy_turns=[by_text_turn(0, rows[: many - 1]), by_text_turn(1, rows[many - 1 :])])
    packed = [t["packed"] for t in wire_turns(result)]
    assert [p["top_texts_width"] for p in packed] == ["i16", "i32"]  # type: ignore[index]
    assert decoded(packed[1], "top_texts", "i") == [many - 1]  # type: ignore[arg-type]
    assert RolloutResult.model_validate_json(result.model_dump_json()).proxy_turns == result.proxy_turns


def test_a_turn_read_on_its_own_carries_every_text_it_needs() -> None:
    want = by_text_turn(0, [(1, "a", -0.5, [("a", -0.5, None), ("b", -1.5, None)])])
    alone = RolloutTurn.model_validate_json(want.packed_for_wire().model_dump_json())
    assert alone.packed is None
    assert_same(alone, want)


def packed_result(turns: list[RolloutTurn]) -> dict[str, object]:
    wire = json.loads(RolloutResult(proxy_turns=turns).model_dump_json())
    assert isinstance(wire, dict)
    return wire


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top_texts", array("h", [0, 7]), r"packed.top_texts: alternative 1's index 7 is outside the result's 2"),
        ("top_texts", array("h", [0, -1]), r"packed.top_texts: alternative 1 has neither an id \(top_ids\)"),
        ("top_texts", array("h", [0]), r"packed.top_texts: 2 bytes, expected 4"),
        ("top_texts_width", "i32", r"packed.top_texts: 4 bytes, expected 8"),
        ("top_texts_width", "i8", r"top_texts_width"),
        ("top_texts", "not base64!", r"packed.top_texts: not base64"),
        ("top_ids", array("i", [1, 1]), r"packed.top_texts: alternative 0 has both an id and a text index"),
        ("sampled_rank", array("b", [2]), r"packed.sampled_rank: a rank outside -1..1"),
        ("ids", "", r"packed.ids: 0 bytes, expected 4"),
        ("alt_texts", ["a"], r"packed.top_texts: alternative 1's index 1 is outside the result's 1"),
        ("top_k", 0, r"packed.top_k: 0, yet the turn carries alternatives"),
    ],
)
def test_a_malformed_v6_packing_is_refused_naming_its_field(field: str, value: object, message: str) -> None:
    wire = packed_result([by_text_turn(0, [(1, "a", -0.5, [("a", -0.5, None), ("b", -1.5, None)])])])
    turns = wire["proxy_turns"]
    assert isinstance(turns, list)
    packed = turns[0]["packed"]
    packed[field] = base64.b64encode(value.tobytes()).decode() if isinstance(value, array) else value
    with pytest.raises(ValueError, match=message):
        RolloutResult.model_validate({"task_id": "t", "status": "completed", "reward": 1.0, **wire})


texts_st = st.sampled_from(["a", " b", "\n", "é", "\u2028", "", "a"])
logprob_st = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, math.nan, -math.inf]),
)


@st.composite
def turn_st(draw: st.DrawFn, number: int, text_of: dict[int, str]) -> RolloutTurn:
    """Any turn the layout can hold: ids with one text each, k alternatives at every position, each with an id
    (and that id's text) or a text only (duplicates included), the sampled token often among them."""
    count = draw(st.integers(1, 6))
    top_k = draw(st.integers(0, 4))
    ids = draw(st.lists(st.integers(1, 8), min_size=count, max_size=count))
    logprobs = draw(st.lists(logprob_st, min_size=count, max_size=count))
    top = []
    for token_id, logprob in zip(ids, logprobs, strict=True):
        row: list[tuple[str, float, int | None]] = []
        for _ in range(top_k):
            choice = draw(st.sampled_from(["sampled", "sampled_no_id", "other", "text"]))
            other = draw(st.integers(1, 8))
            row.append(
                (text_of[token_id], logprob, token_id)
                if choice == "sampled"
                else (text_of[token_id], logprob, None)
                if choice == "sampled_no_id"
                else (text_of[other], draw(logprob_st), other)
                if choice == "other"
                else (draw(texts_st), draw(logprob_st), None)
            )
        top.append(row)
    return RolloutTurn(
        turn=number,
        completion_token_ids=ids,
        completion_tokens=[text_of[i] for i in ids],
        per_token_logps=logprobs,
        top_logprobs=top if top_k else [],
    )


@st.composite
def result_st(draw: st.DrawFn) -> RolloutResult:
    """Up to four turns of one result, sharing one text per id (and so texts across turns)."""
    text_of = {token_id: draw(texts_st) for token_id in range(1, 9)}
    return RolloutResult(proxy_turns=[draw(turn_st(number, text_of)) for number in range(draw(st.integers(1, 4)))])


@settings(max_examples=300, deadline=None)
@given(result_st())
def test_any_mix_of_alternatives_with_and_without_ids_round_trips_bit_for_bit(result: RolloutResult) -> None:
    """Packed (every NaN's sign and payload kept, which version 3's lists cannot), and back bit for bit."""
    wire = wire_turns(result)
    assert all(travelled["packed"] is not None for travelled in wire)
    parsed = RolloutResult.model_validate_json(result.model_dump_json())
    for got, want in zip(parsed.proxy_turns, result.proxy_turns, strict=True):
        assert_same(got, want)
        assert got.packed is None


def test_a_count_the_arrays_do_not_hold_is_refused_before_anything_that_size_is_made() -> None:
    wire = packed_result([by_text_turn(0, [(1, "a", -0.5, [("a", -0.5, None), ("b", -1.5, None)])])])
    turns = wire["proxy_turns"]
    assert isinstance(turns, list)
    turns[0]["packed"]["count"] = 10**12
    with pytest.raises(ValueError, match=r"packed.top_logprobs: 8 bytes, expected 8000000000000"):
        RolloutResult.model_validate({"task_id": "t", "status": "completed", "reward": 1.0, **wire})
