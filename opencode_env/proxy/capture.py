"""The pure half of the capture proxy: rewrite a request, fold an upstream answer into one turn record.

Nothing here does I/O. A streamed answer is kept as the raw bytes that were forwarded, with the arrival time of
each read; `fold_stream` splits it into SSE events on blank lines only (never on U+2028, U+2029 or U+0085, which
vLLM leaves unescaped inside JSON) and assembles content, reasoning, tool calls, logprobs and token ids.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

EndpointKind = Literal["vllm", "openai", "hf_router", ""]
TopEntry = tuple[str, float, int | None]

_EVENT_SEPARATOR = re.compile(rb"\r?\n\r?\n")
_TOKEN_ID_STRING = re.compile(r"token_id:(-?\d+)\Z")
_MAX_COMPLETION_TOKENS_MODELS = re.compile(r"(^|/)(o\d|gpt-5)", re.IGNORECASE)
_RETRY_TRIGGERS = re.compile(r"server_error|overloaded|rate.?limit|ECONNREFUSED|too many requests", re.IGNORECASE)
TOP_LOGPROBS_LIMIT = {"hf_router": 5, "openai": 20, "vllm": 20, "": 20}


@dataclass(frozen=True)
class RewriteConfig:
    endpoint_kind: EndpointKind = ""
    model_override: str = ""
    top_logprobs: int = 5
    max_tokens_cap: int = 4096
    disable_thinking: bool = False


def uses_max_completion_tokens(model: str) -> bool:
    """o-series and gpt-5 models reject `max_tokens` and refuse logprobs."""
    return bool(_MAX_COMPLETION_TOKENS_MODELS.search(model))


def rewrite_request(body: dict[str, Any], config: RewriteConfig) -> dict[str, Any]:
    """The request as sent upstream: the real model, logprobs asked for, max tokens capped, thinking as configured."""
    out = dict(body)
    if config.model_override:
        out["model"] = config.model_override
    model = str(out.get("model", ""))
    wanted = [v for v in (out.pop("max_tokens", None), out.pop("max_completion_tokens", None)) if isinstance(v, int)]
    limit = min([config.max_tokens_cap, *wanted])
    if uses_max_completion_tokens(model):
        out["max_completion_tokens"] = limit
    else:
        out["max_tokens"] = limit
        out["logprobs"] = True
        out["top_logprobs"] = min(config.top_logprobs, TOP_LOGPROBS_LIMIT.get(config.endpoint_kind, 20))
    if config.endpoint_kind == "vllm":
        out["return_token_ids"] = True
    if config.disable_thinking:
        kwargs = dict(out.get("chat_template_kwargs") or {})
        kwargs["enable_thinking"] = False
        out["chat_template_kwargs"] = kwargs
    if not out.get("stream"):
        out.pop("stream_options", None)
    return out


def neutral_error(status: int, upstream_body: bytes) -> dict[str, Any]:
    """A 400 body that OpenCode will not retry: the upstream's message without the words that trigger retries."""
    message = upstream_body[:2000].decode("utf-8", errors="replace")
    try:
        parsed = json.loads(upstream_body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            message = str(parsed["error"].get("message", message))
    except ValueError:
        pass
    cleaned = _RETRY_TRIGGERS.sub("[upstream error]", message)
    return {
        "error": {
            "message": f"upstream rejected the request (HTTP {status}): {cleaned}",
            "type": "invalid_request_error",
            "code": status,
        }
    }


@dataclass
class Fold:
    """What an upstream answer said, assembled."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[TopEntry]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    first_token_offset: int | None = None
    unparsed_events: int = 0

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"content": "".join(self.content)}
        if self.reasoning:
            message["reasoning"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        return message

    def token_id_source(self) -> Literal["return_token_ids", "token_id_strings", "none"]:
        if self.token_ids:
            return "return_token_ids"
        if self.tokens and all(_TOKEN_ID_STRING.match(token) for token in self.tokens):
            return "token_id_strings"
        return "none"

    def ids(self) -> list[int]:
        source = self.token_id_source()
        if source == "return_token_ids":
            return self.token_ids
        if source == "token_id_strings":
            return [_id_of(token) or 0 for token in self.tokens]
        return []

    def aligned(self) -> bool:
        count = self.usage.get("completion_tokens")
        return count is not None and len(self.ids()) == len(self.logprobs) == count


def _id_of(token: str) -> int | None:
    match = _TOKEN_ID_STRING.match(token)
    return int(match.group(1)) if match else None


def _fold_logprobs(fold: Fold, logprobs: Any) -> None:
    if not isinstance(logprobs, dict):
        return
    for entry in logprobs.get("content") or []:
        token = str(entry.get("token", ""))
        fold.tokens.append(token)
        fold.logprobs.append(float(entry.get("logprob", 0.0)))
        fold.top_logprobs.append(
            [
                (str(alt.get("token", "")), float(alt.get("logprob", 0.0)), _id_of(str(alt.get("token", ""))))
                for alt in entry.get("top_logprobs") or []
            ]
        )


def _fold_tool_call_delta(fold: Fold, delta: dict[str, Any]) -> None:
    index = int(delta.get("index", 0))
    call = fold.tool_calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    if delta.get("id"):
        call["id"] = str(delta["id"])
    function = delta.get("function") or {}
    if function.get("name"):
        call["name"] += str(function["name"])
    if function.get("arguments"):
        call["arguments"] += str(function["arguments"])


def fold_chunk(fold: Fold, chunk: dict[str, Any]) -> None:
    if isinstance(chunk.get("prompt_token_ids"), list):
        fold.prompt_token_ids = [int(i) for i in chunk["prompt_token_ids"]]
    if isinstance(chunk.get("usage"), dict):
        fold.usage = {k: v for k, v in chunk["usage"].items() if isinstance(v, int)}
    if chunk.get("error") is not None:
        fold.error = json.dumps(chunk["error"], ensure_ascii=False)[:2000]
    for choice in chunk.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or choice.get("message") or {}
        if isinstance(delta.get("content"), str):
            fold.content.append(delta["content"])
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                fold.reasoning.append(delta[key])
        for call in delta.get("tool_calls") or []:
            _fold_tool_call_delta(fold, call)
        _fold_logprobs(fold, choice.get("logprobs"))
        if isinstance(choice.get("token_ids"), list):
            fold.token_ids.extend(int(i) for i in choice["token_ids"])
        if choice.get("finish_reason"):
            fold.finish_reason = str(choice["finish_reason"])


def _events(raw: bytes) -> list[tuple[bytes, int]]:
    """SSE events with the offset just past each one, split on blank lines only."""
    events, start = [], 0
    for separator in _EVENT_SEPARATOR.finditer(raw):
        events.append((raw[start : separator.start()], separator.end()))
        start = separator.end()
    if start < len(raw):
        events.append((raw[start:], len(raw)))
    return events


def fold_stream(raw: bytes | bytearray) -> Fold:
    fold = Fold()
    for event, offset in _events(bytes(raw)):
        data = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data:
            continue
        if data.strip() == b"[DONE]":
            fold.done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            fold.unparsed_events += 1
            continue
        if isinstance(chunk, dict):
            had_tokens = len(fold.tokens) + len(fold.token_ids)
            fold_chunk(fold, chunk)
            if fold.first_token_offset is None and len(fold.tokens) + len(fold.token_ids) > had_tokens:
                fold.first_token_offset = offset
    return fold


def fold_response(raw: bytes) -> Fold:
    fold = Fold()
    try:
        body = json.loads(raw)
    except ValueError:
        fold.error = "the upstream answer is not JSON"
        return fold
    if isinstance(body, dict):
        fold_chunk(fold, body)
        for choice in body.get("choices") or []:
            if choice.get("index", 0) == 0 and isinstance(choice.get("message"), dict):
                fold.tool_calls = {
                    i: {
                        "id": str(c.get("id", "")),
                        "name": str((c.get("function") or {}).get("name", "")),
                        "arguments": str((c.get("function") or {}).get("arguments", "")),
                    }
                    for i, c in enumerate(choice["message"].get("tool_calls") or [])
                }
        fold.done = True
    return fold


def compact_request(body: dict[str, Any], previous: list[tuple[int, list[str]]]) -> tuple[dict[str, Any], list[str]]:
    """The request without what earlier turns already hold: messages after the longest shared prefix.

    `previous` lists (turn, message hashes) of earlier turns; returns the record and this turn's message hashes.
    """
    messages = body.get("messages") or []
    hashes = [_digest(message) for message in messages]
    base_turn, shared = None, 0
    for turn, earlier in reversed(previous):
        if len(earlier) <= len(hashes) and hashes[: len(earlier)] == earlier and len(earlier) > shared:
            base_turn, shared = turn, len(earlier)
    record = {key: copy.deepcopy(value) for key, value in body.items() if key not in ("messages", "tools")}
    record["messages_base"] = None if base_turn is None else {"turn": base_turn, "count": shared}
    record["messages"] = messages[shared:]
    if body.get("tools"):
        record["tools_sha256"] = _digest(body["tools"])
    return record, hashes


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def tools_blob(body: dict[str, Any]) -> tuple[str, Any] | None:
    tools = body.get("tools")
    return (_digest(tools), tools) if tools else None


SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)
_SKIPPED_HEADERS = frozenset({"host", "content-length", "connection", "accept-encoding", "accept"})


def recorded_headers(headers: dict[str, str]) -> dict[str, str]:
    return {
        name.lower(): "[redacted]" if SECRET_HEADER.search(name) else value
        for name, value in headers.items()
        if name.lower() not in _SKIPPED_HEADERS
    }


def turn_kind(body: dict[str, Any], headers: dict[str, str]) -> Literal["agent", "auxiliary", "sub_agent"]:
    if headers.get("x-rlm-role", "").lower() == "sub":
        return "sub_agent"
    return "agent" if body.get("tools") else "auxiliary"
