"""The result's wire shape: results written by earlier code keep parsing, and the compact shape round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_env.client.client import parse_result
from opencode_env.rollout.proxy_session import parse_trace
from opencode_env.training.sequences import training_sequences
from opencode_env.wire import SCHEMA_VERSION, MessagesBase, RolloutResult, RolloutTurn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
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


def long_rollout(turns: int, *, start: int = 200, completion: int = 20, tool_output: int = 30) -> RolloutResult:
    """An append-only conversation: each prompt is the previous prompt + completion + tool output ids."""
    prompt = list(range(1000, 1000 + start))
    records = []
    for number in range(turns):
        generated = [50_000 + number * 100 + k for k in range(completion - 1)] + [151645]
        records.append(
            RolloutTurn(
                turn=number,
                prompt_token_ids=list(prompt),
                completion_token_ids=generated,
                per_token_logps=[-0.25] * completion,
                aligned=True,
                token_id_source="return_token_ids",
                usage={"prompt_tokens": len(prompt), "completion_tokens": completion},
                request={"messages": [{"role": "tool", "content": f"out {number}"}] if number else [{"role": "user"}]},
                messages_base=MessagesBase(turn=number - 1, count=number) if number else None,
            )
        )
        prompt = prompt + generated + [70_000 + number * 100 + k for k in range(tool_output)]
    return RolloutResult(task_id="long", proxy_turns=records)


def test_the_compact_shape_round_trips_losslessly_and_writes_each_prompt_id_once() -> None:
    result = long_rollout(50)
    wire = json.loads(result.model_dump_json())
    assert wire["schema_version"] == SCHEMA_VERSION == 6
    turns = wire["proxy_turns"]
    assert len(turns[0]["prompt_token_ids"]) == 200
    assert turns[0]["prompt_base"] is None
    for number, turn in enumerate(turns[1:], start=1):
        assert turn["prompt_token_ids"] == []
        assert turn["prompt_base"] == {
            "turn": number - 1,
            "count": len(result.proxy_turns[number - 1].prompt_token_ids) + 20,
        }
        assert len(turn["prompt_suffix_ids"]) == 30
    assert RolloutResult.model_validate(wire) == result
    assert RolloutResult.model_validate_json(result.model_dump_json()) == result
    assert RolloutResult.model_validate(result.model_dump()) == result


def test_a_prompt_that_forks_references_the_shared_part_only() -> None:
    result = long_rollout(3)
    third = result.proxy_turns[2]
    third.prompt_token_ids = [*third.prompt_token_ids[:150], 7, 7, 7]
    wire = json.loads(result.model_dump_json())
    assert wire["proxy_turns"][2]["prompt_base"] == {"turn": 1, "count": 150}
    assert wire["proxy_turns"][2]["prompt_suffix_ids"] == [7, 7, 7]
    assert RolloutResult.model_validate(wire) == result


def test_the_wire_version_1_fixture_round_trips_through_the_compact_shape() -> None:
    old = RolloutResult.model_validate_json(V0_DEMO.read_bytes())
    assert RolloutResult.model_validate_json(old.model_dump_json()) == old
    assert len(old.model_dump_json()) < len(V0_DEMO.read_bytes()) * 0.8
    raw = json.loads(V0_DEMO.read_bytes())
    assert "messages_base" in raw["proxy_turns"][1]["request"]
    assert old.proxy_turns[1].messages_base == MessagesBase(**raw["proxy_turns"][1]["request"]["messages_base"])
    assert "messages_base" not in old.proxy_turns[1].request


def test_messages_of_a_thousand_turn_chain_rebuild_without_recursion() -> None:
    result = long_rollout(1500, start=5, completion=2, tool_output=1)
    messages = result.all_turn_messages()
    assert len(messages[-1]) == 1500
    assert messages[-1][-1] == {"role": "tool", "content": "out 1499"}
    assert result.turn_messages(1499) == messages[-1]
    assert result.prompt_ids(1499) == result.proxy_turns[1499].prompt_token_ids


def test_bad_references_are_named() -> None:
    wire = json.loads(long_rollout(3).model_dump_json())
    wire["proxy_turns"][2]["prompt_base"]["count"] = 10**6
    with pytest.raises(ValidationError, match=r"proxy_turns\[2\]\.prompt_base\.count: 1000000 is over"):
        RolloutResult.model_validate(wire)
    wire = json.loads(long_rollout(3).model_dump_json())
    wire["proxy_turns"][1]["prompt_base"]["turn"] = 2
    with pytest.raises(ValidationError, match=r"proxy_turns\[1\]\.prompt_base\.turn: 2 is not an earlier turn"):
        RolloutResult.model_validate(wire)
    wire = json.loads(long_rollout(3).model_dump_json())
    wire["proxy_turns"][1]["prompt_token_ids"] = [1]
    with pytest.raises(ValidationError, match=r"proxy_turns\[1\]: prompt_token_ids and prompt_base"):
        RolloutResult.model_validate(wire)
    cyclic = long_rollout(2)
    cyclic.proxy_turns[0].messages_base = MessagesBase(turn=1, count=0)
    with pytest.raises(ValueError, match="cycle"):
        cyclic.turn_messages(1)


def test_a_client_ignores_fields_it_does_not_know() -> None:
    wire = json.loads(long_rollout(3).model_dump_json())
    wire["a_field_from_the_future"] = {"x": 1}
    wire["proxy_turns"][1]["another_new_field"] = [1, 2]
    result = parse_result(wire)
    assert result.proxy_turns[2].prompt_token_ids == long_rollout(3).proxy_turns[2].prompt_token_ids


def test_a_result_of_a_newer_schema_is_refused_naming_its_version() -> None:
    """A newer version may carry tokens in a shape this code would read as empty lists: refused, never guessed."""
    wire = json.loads(long_rollout(3).model_dump_json())
    wire["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match=f"schema_version {SCHEMA_VERSION + 1} is not one this opencode-env knows"):
        parse_result(wire)


def trace_line(**fields: object) -> str:
    return json.dumps({"type": "turn", "turn": 0, **fields})


def test_the_proxy_trace_is_parsed_strictly() -> None:
    good = trace_line(prompt_token_ids=[1, 2], completion_token_ids=[3], request={"messages": []})
    unknown_key = trace_line(turn=1, surprise=True)
    unknown_outcome = trace_line(turn=2, outcome="exploded")
    bad_base = trace_line(turn=3, prompt_base={"turn": 9, "count": 1})
    over_base = trace_line(turn=4, prompt_base={"turn": 0, "count": 4})
    trace = parse_trace("\n".join([good, unknown_key, unknown_outcome, bad_base, over_base, '{"type": "mystery"}']))
    assert [turn.turn for turn in trace.turns] == [0]
    assert len(trace.problems) == 5
    assert "surprise" in trace.problems[0]
    assert "Extra inputs are not permitted" in trace.problems[0]
    assert "exploded" in trace.problems[1]
    assert "prompt_base.turn 9 is not an earlier turn" in trace.problems[2]
    assert "prompt_base.count 4 is over" in trace.problems[3]
    assert trace.problems[4].startswith("trace line 6:")


def test_sampling_is_bounded_and_belongs_to_the_proxy() -> None:
    from pydantic import ValidationError

    from opencode_env.wire import RolloutRequest, Sampling

    request = RolloutRequest(instruction="x", sampling=Sampling(temperature=0.7, seed=3))
    assert request.sampling is not None
    assert request.sampling.sent() == {"temperature": 0.7, "seed": 3}
    with pytest.raises(ValidationError, match="top_p"):
        Sampling(top_p=0)
    with pytest.raises(ValidationError, match="transparent_proxy mode only"):
        RolloutRequest(instruction="x", mode="black_box", sampling={"temperature": 0.2})
