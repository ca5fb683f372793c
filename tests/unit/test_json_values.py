"""The proxy's fast JSON parsing gives exactly `json.loads`'s values, on any input, with orjson and without it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from opencode_env.proxy import json_values
from opencode_env.proxy.capture import fold_stream
from opencode_env.proxy.json_values import has_long_integer, loads, loads_for, stdlib_loads


def exact(value: Any) -> str:
    """A text that tells apart what == does not: 1 and 1.0, 0.0 and -0.0, and NaN from anything."""
    return json.dumps(value)


def same_as_json(raw: bytes) -> None:
    try:
        expected = exact(json.loads(raw))
    except ValueError as error:
        with pytest.raises(type(error), match=re.escape(str(error))):
            loads(raw)
        return
    assert exact(loads(raw)) == expected


json_values_strategy = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400)
@given(json_values_strategy)
def test_any_value_parses_as_json_parses_it(value: Any) -> None:
    same_as_json(json.dumps(value).encode("utf-8", "surrogatepass"))
    same_as_json(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


number_text = st.builds(
    lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
    st.sampled_from(["", "-"]),
    st.from_regex(r"\A(0|[1-9][0-9]{0,24})\Z"),
    st.sampled_from([""]) | st.from_regex(r"\A\.[0-9]{1,30}\Z"),
    st.sampled_from([""]) | st.from_regex(r"\A[eE][+-]?[0-9]{1,4}\Z"),
)


@settings(max_examples=600)
@given(number_text)
@example("18446744073709551617")
@example("-9223372036854775809")
@example("2.4703282292062328e-324")
@example("1e400")
@example("-0.0012345678901234567")
def test_any_number_parses_to_the_same_int_or_float(text: str) -> None:
    same_as_json(text.encode())
    same_as_json(f'{{"usage": {{"tokens": {text}}}, "data": [{text}, " {text} "]}}'.encode())


@pytest.mark.parametrize(
    "raw",
    [b"NaN", b"[-Infinity]", b'"\\ud800"', b"1e400", b"[18446744073709551617]", b"\xef\xbb\xbf{}", b"{", b"\xff"],
)
def test_what_orjson_refuses_or_reads_differently_still_gets_json_values(raw: bytes) -> None:
    same_as_json(raw)


def test_orjson_parses_a_stream_without_long_integers_and_json_one_with_them() -> None:
    assert loads_for(b'data: {"logprob": -0.0012345678901234567, "id": 151643}\n\n') is not stdlib_loads
    assert loads_for(b'data: {"usage": {"total": 18446744073709551617}}\n\n') is stdlib_loads


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"-9223372036854775809", True),
        (b'{"a":1234567890123456789}', True),
        (b"1234567890123456789", True),
        (b"123456789012345678", False),
        (b"-0.0012345678901234567", False),
        (b"[1.5, 2.25e-10]", False),
    ],
)
def test_long_integers_are_found_and_long_fractions_are_not(raw: bytes, expected: bool) -> None:
    assert has_long_integer(raw) is expected


def test_a_stream_folds_the_same_with_orjson_and_without(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": f"w{i} \u2028\U0001f600"},
                    "logprobs": {
                        "content": [
                            {
                                "token": f"token_id:{i}",
                                "logprob": -(i + 1) / 7e3,
                                "top_logprobs": [{"token": f"token_id:{i + k}", "logprob": -k / 3} for k in range(5)],
                            }
                        ]
                    },
                    "token_ids": [i],
                }
            ]
        }
        for i in range(50)
    ]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 50}, "prompt_token_ids": [1, 2]})
    events = [b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n" for chunk in chunks]
    raw = b"".join(events) + b"data: [DONE]\n\n"
    with_orjson = fold_stream(raw)
    monkeypatch.setattr(json_values, "orjson", None)
    assert loads_for(raw) is stdlib_loads
    assert fold_stream(raw) == with_orjson
    assert with_orjson.aligned()
    assert with_orjson.done
