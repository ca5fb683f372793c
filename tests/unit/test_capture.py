"""The pure capture: request rewriting and folding recorded chunk sequences into a turn."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from opencode_env.inside.prefix import common_prefix_length
from opencode_env.proxy.capture import (
    TraceCompactor,
    _newline_events,
    _separated_events,
    fold_response,
    fold_stream,
)
from opencode_env.proxy.request import RewriteConfig, neutral_error, recorded_headers, rewrite_request, turn_kind
from opencode_env.rollout.proxy_session import parse_trace
from opencode_env.wire import RolloutResult


def sse(*chunks: dict[str, Any] | str, separator: str = "\n\n") -> bytes:
    events = [f"data: {c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)}" for c in chunks]
    return (separator.join(events) + separator).encode()


def chunk(
    delta: dict[str, Any],
    *,
    logprob: tuple[str, float | None] | None = None,
    ids: list[int] | None = None,
    finish: str | None = None,
    top: list[tuple[str, float | None]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprob is not None:
        alternatives = [{"token": t, "logprob": lp} for t, lp in (top or [])]
        choice["logprobs"] = {"content": [{"token": logprob[0], "logprob": logprob[1], "top_logprobs": alternatives}]}
    if ids is not None:
        choice["token_ids"] = ids
    return {"object": "chat.completion.chunk", "choices": [choice], **extra}


USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}


def test_openai_style_stream_has_logprobs_but_no_ids() -> None:
    raw = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hi"}, logprob=("Hi", -0.25), top=[("Hi", -0.25), ("Hey", -1.5)]),
        chunk({"content": "!"}, logprob=("!", -0.125), finish="stop"),
        USAGE,
        "[DONE]",
    )
    fold = fold_stream(raw)
    assert fold.message() == {"content": "Hi!"}
    assert (fold.tokens, fold.logprobs) == (["Hi", "!"], [-0.25, -0.125])
    assert fold.top_logprobs[0] == [("Hi", -0.25, None), ("Hey", -1.5, None)]
    assert (fold.ids(), fold.token_id_source(), fold.aligned()) == ([], "none", False)
    assert fold.finish_reason == "stop"
    assert fold.usage["completion_tokens"] == 2
    assert fold.done


def test_vllm_style_stream_has_engine_ids_and_prompt_ids() -> None:
    raw = sse(
        chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
        chunk({"content": "ok"}, logprob=("ok", -0.5), ids=[77]),
        chunk({}, logprob=("", -0.01), ids=[151645], finish="stop"),
        USAGE,
        "[DONE]",
    )
    fold = fold_stream(raw)
    assert fold.prompt_token_ids == [1, 2, 3]
    assert fold.ids() == [77, 151645]
    assert (fold.token_id_source(), fold.aligned()) == ("return_token_ids", True)


def test_a_null_logprob_is_kept_as_nan_and_the_turn_still_folds() -> None:
    """vLLM writes a NaN or infinite logprob as null (seen on 0.32 with NaN logits); the fold used to raise."""
    raw = sse(
        chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2]),
        chunk({"content": "<|endoftext|>"}, logprob=("<|endoftext|>", None), ids=[0], top=[("x", None)]),
        chunk({}, logprob=("", -0.5), ids=[0], finish="length"),
        USAGE,
        "[DONE]",
    )
    fold = fold_stream(raw)
    assert math.isnan(fold.logprobs[0])
    assert fold.logprobs[1] == -0.5
    assert math.isnan(fold.top_logprobs[0][0][1])
    assert (fold.ids(), fold.aligned()) == ([0, 0], True)


def test_token_id_strings_are_a_fallback_source_of_ids() -> None:
    raw = sse(
        chunk({"content": "a"}, logprob=("token_id:42", -0.1), top=[("token_id:42", -0.1), ("token_id:7", -2.0)]),
        chunk({"content": "b"}, logprob=("token_id:43", -0.2), finish="stop"),
        USAGE,
        "[DONE]",
    )
    fold = fold_stream(raw)
    assert (fold.ids(), fold.token_id_source(), fold.aligned()) == ([42, 43], "token_id_strings", True)
    assert fold.top_logprobs[0] == [("token_id:42", -0.1, 42), ("token_id:7", -2.0, 7)]


def test_tool_call_fragments_are_joined_by_index() -> None:
    raw = sse(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c0", "type": "function", "function": {"name": "bash", "arguments": ""}}
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p'}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command":'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '":1}'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}, finish="tool_calls"),
        "[DONE]",
    )
    fold = fold_stream(raw)
    assert fold.message()["tool_calls"] == [
        {"id": "c0", "name": "bash", "arguments": '{"command":"ls"}'},
        {"id": "c1", "name": "read", "arguments": '{"p":1}'},
    ]
    assert fold.finish_reason == "tool_calls"


def test_reasoning_deltas_and_chunks_without_logprobs() -> None:
    raw = sse(chunk({"reasoning_content": "think "}), chunk({"reasoning": "more"}), chunk({"content": "x"}), "[DONE]")
    fold = fold_stream(raw)
    assert fold.message() == {"content": "x", "reasoning": "think more"}
    assert fold.tokens == []
    assert fold.first_token_offset is None


def test_error_mid_stream_and_a_cut_stream_are_not_clean() -> None:
    errored = fold_stream(sse(chunk({"content": "a"}, logprob=("a", -1.0)), {"error": {"message": "engine died"}}))
    assert "engine died" in (errored.error or "")
    cut = fold_stream(
        sse(chunk({"content": "a"}, logprob=("a", -1.0)), chunk({"content": "b"}, logprob=("b", -1.0)))[:-10]
    )
    assert not cut.done
    assert cut.tokens == ["a"]
    assert cut.unparsed_events == 1


def test_line_separators_inside_json_do_not_split_events() -> None:
    text = "a\u2028b\u2029c\u0085d"
    raw = sse(chunk({"content": text}, logprob=(text, -0.5)), "[DONE]", separator="\r\n\r\n")
    assert "\u2028".encode() in raw
    fold = fold_stream(raw)
    assert fold.message()["content"] == text
    assert fold.tokens == [text]
    assert fold.unparsed_events == 0


def test_non_streamed_response_is_folded() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "token_ids": [5, 6],
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "bash", "arguments": "{}"}}],
                },
                "logprobs": {
                    "content": [
                        {"token": "x", "logprob": -1.0, "top_logprobs": []},
                        {"token": "y", "logprob": -2.0, "top_logprobs": []},
                    ]
                },
            }
        ],
        "prompt_token_ids": [1],
        "usage": {"completion_tokens": 2},
    }
    fold = fold_response(json.dumps(body).encode())
    assert fold.message()["tool_calls"] == [{"id": "c", "name": "bash", "arguments": "{}"}]
    assert (fold.ids(), fold.prompt_token_ids, fold.aligned()) == ([5, 6], [1], True)


def test_rewrite_for_vllm() -> None:
    body = {
        "model": "policy",
        "max_tokens": 32000,
        "stream": True,
        "messages": [],
        "chat_template_kwargs": {"custom": 1},
    }
    sent = rewrite_request(
        body,
        RewriteConfig(
            endpoint_kind="vllm",
            model_override="Qwen/Qwen3-8B",
            top_logprobs=0,
            max_tokens_cap=1024,
            disable_thinking=True,
        ),
    )
    assert sent["model"] == "Qwen/Qwen3-8B"
    assert (sent["max_tokens"], sent["logprobs"], sent["top_logprobs"], sent["return_token_ids"]) == (
        1024,
        True,
        0,
        True,
    )
    assert sent["chat_template_kwargs"] == {"custom": 1, "enable_thinking": False}
    assert body["model"] == "policy"


def test_rewrite_for_reasoning_models_and_providers() -> None:
    sent = rewrite_request(
        {"model": "x", "max_tokens": 100, "stream": False, "stream_options": {}},
        RewriteConfig(endpoint_kind="openai", model_override="gpt-5-mini", max_tokens_cap=4096),
    )
    assert sent["max_completion_tokens"] == 100
    assert "max_tokens" not in sent
    assert "logprobs" not in sent
    assert "stream_options" not in sent
    assert "return_token_ids" not in sent
    routed = rewrite_request({"model": "m", "stream": True}, RewriteConfig(endpoint_kind="hf_router", top_logprobs=20))
    assert routed["top_logprobs"] == 5


def test_neutral_error_removes_retry_triggers() -> None:
    body = json.dumps({"error": {"message": "Rate limit? No: server_error overloaded bad field"}}).encode()
    message = neutral_error(422, body)["error"]["message"]
    assert "HTTP 422" in message
    assert "bad field" in message
    for trigger in ("Rate limit", "server_error", "overloaded"):
        assert trigger not in message


def test_headers_are_recorded_lowercased_with_secrets_redacted() -> None:
    recorded = recorded_headers(
        {"Authorization": "Bearer sk-1", "X-Api-Key": "k", "x-session-id": "ses_1", "Host": "h"}
    )
    assert recorded == {"authorization": "[redacted]", "x-api-key": "[redacted]", "x-session-id": "ses_1"}
    assert turn_kind({"tools": [{}]}, {"x-rlm-role": "sub"}) == "sub_agent"
    assert turn_kind({}, {}) == "auxiliary"


def test_compact_records_rebuild_to_the_full_messages_and_prompt_ids() -> None:
    system = {"role": "system", "content": "S" * 10_000}
    tools = [{"type": "function", "function": {"name": "bash"}}]
    bodies = [
        {"model": "m", "messages": [system, {"role": "user", "content": "u"}], "tools": tools},
        {"model": "m", "messages": [{"role": "user", "content": "title please"}]},
        {
            "model": "m",
            "messages": [
                system,
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"},
                {"role": "tool", "content": "t"},
            ],
            "tools": tools,
        },
    ]
    ids = [([1, 2, 3], [4, 5]), ([9, 9], [8]), ([1, 2, 3, 4, 5, 6, 7], [10])]
    compactor = TraceCompactor()
    lines = []
    for number, (body, (prompt, completion)) in enumerate(zip(bodies, ids, strict=True)):
        request, prompt_fields, blob = compactor.compact(number, body, prompt, completion)
        if blob:
            lines.append({"type": "tools", "sha256": blob[0], "tools": blob[1]})
        lines.append(
            {"type": "turn", "turn": number, "request": request, **prompt_fields, "completion_token_ids": completion}
        )
    third = lines[-1]
    assert third["request"]["messages_base"] == {"turn": 0, "count": 2}
    assert len(third["request"]["messages"]) == 2
    assert third["prompt_base"] == {"turn": 0, "count": 5}
    assert third["prompt_token_ids"] == [6, 7]
    assert sum(1 for line in lines if line["type"] == "tools") == 1
    trace = parse_trace("\n".join(json.dumps(line) for line in lines))
    assert [turn.prompt_token_ids for turn in trace.turns] == [prompt for prompt, _ in ids]
    result = RolloutResult(proxy_turns=trace.turns, request_tools=trace.tools)
    assert [result.turn_messages(i) for i in range(3)] == [b["messages"] for b in bodies]
    assert result.request_tools[trace.turns[2].tools_sha256 or ""] == tools


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5], [6]) == 0


@given(st.lists(st.sampled_from([b"\n", b"\n\n", b"data: ", b"{}", b"x", b": comment"]), max_size=40))
def test_the_fast_event_split_finds_what_the_separator_scan_finds(parts: list[bytes]) -> None:
    raw = b"".join(parts)
    assert _newline_events(raw) == _separated_events(raw)
