"""The pure half of the capture proxy: fold an upstream answer into one turn record, and compact the records.

Nothing here does I/O. A streamed answer is kept as the raw bytes that were forwarded, with the arrival time of
each read; `fold_stream` splits it into SSE events on blank lines only (never on U+2028, U+2029 or U+0085, which
vLLM leaves unescaped inside JSON) and assembles content, reasoning, tool calls, logprobs and token ids. The
request's side (the rewrite sent upstream, the call's kind) is in request.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from opencode_env.inside.prefix import common_prefix_length
from opencode_env.proxy.json_values import loads, loads_for

TopEntry = tuple[str, float, int | None]

_EVENT_SEPARATOR = re.compile(rb"\r?\n\r?\n")
_TOKEN_ID_STRING = re.compile(r"token_id:(-?\d+)\Z")


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
    if not token.startswith("token_id:"):
        return None
    match = _TOKEN_ID_STRING.match(token)
    return int(match.group(1)) if match else None


def _logprob(entry: dict[str, Any]) -> float:
    """A null is NaN: vLLM's JSON (pydantic) writes a NaN or infinite logprob as null, and which one it was is
    lost (seen on vLLM 0.32 with a model whose logits went NaN: every token the pad id, every logprob null)."""
    value = entry.get("logprob", 0.0)
    if type(value) is float:
        return value
    return math.nan if value is None else float(value)


def _top_entry(alt: dict[str, Any]) -> TopEntry:
    token = alt.get("token", "")
    if type(token) is not str:
        token = str(token)
    return token, _logprob(alt), _id_of(token)


def _fold_logprobs(fold: Fold, logprobs: Any) -> None:
    """Once per sampled token (five alternatives each at top-5): the fold's hottest loop, kept to plain calls."""
    if not isinstance(logprobs, dict):
        return
    tokens, values, tops = fold.tokens, fold.logprobs, fold.top_logprobs
    for entry in logprobs.get("content") or []:
        tokens.append(str(entry.get("token", "")))
        values.append(_logprob(entry))
        tops.append([_top_entry(alt) for alt in entry.get("top_logprobs") or []])


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
        fold.prompt_token_ids = list(map(int, chunk["prompt_token_ids"]))
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
            fold.token_ids.extend(map(int, choice["token_ids"]))
        if choice.get("finish_reason"):
            fold.finish_reason = str(choice["finish_reason"])


def _events(raw: bytes) -> list[tuple[bytes, int]]:
    """SSE events with the offset just past each one, split on blank lines only."""
    return _newline_events(raw) if b"\r" not in raw else _separated_events(raw)


def _separated_events(raw: bytes) -> list[tuple[bytes, int]]:
    events, start = [], 0
    for separator in _EVENT_SEPARATOR.finditer(raw):
        events.append((raw[start : separator.start()], separator.end()))
        start = separator.end()
    if start < len(raw):
        events.append((raw[start:], len(raw)))
    return events


def _newline_events(raw: bytes) -> list[tuple[bytes, int]]:
    """`_events` for a stream without carriage returns (vLLM's, OpenAI's): a split at C speed, not a regex scan."""
    events, end = [], 0
    pieces = raw.split(b"\n\n")
    for piece in pieces[:-1]:
        end += len(piece) + 2
        events.append((piece, end))
    if pieces[-1]:
        events.append((pieces[-1], len(raw)))
    return events


def fold_stream(raw: bytes | bytearray) -> Fold:
    fold = Fold()
    raw = bytes(raw)
    parse = loads_for(raw)
    for event, offset in _events(raw):
        data = _event_data(event)
        if not data:
            continue
        if data[-1:] != b"}" and data.strip() == b"[DONE]":
            fold.done = True
            continue
        try:
            chunk = parse(data)
        except ValueError:
            fold.unparsed_events += 1
            continue
        if not isinstance(chunk, dict):
            continue
        if fold.first_token_offset is not None:
            fold_chunk(fold, chunk)
            continue
        had_tokens = len(fold.tokens) + len(fold.token_ids)
        fold_chunk(fold, chunk)
        if len(fold.tokens) + len(fold.token_ids) > had_tokens:
            fold.first_token_offset = offset
    return fold


def _event_data(event: bytes) -> bytes:
    """An SSE event's data: its `data:` lines' values joined by newlines (an event of one such line, vLLM's every
    event, without the split and join)."""
    if b"\n" not in event and event.startswith(b"data:"):
        return event[5:].lstrip(b" ")
    return b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))


def fold_response(raw: bytes) -> Fold:
    fold = Fold()
    try:
        body = loads(raw)
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


@dataclass
class _Written:
    turn: int
    messages: list[Any]
    token_ids: list[int]


class TraceCompactor:
    """Turns a request and its ids into a compact record, by reference to turns already written.

    A turn stores only the messages after the longest prefix it shares with a recent turn, and only the prompt ids
    after the longest prefix it shares with a recent turn's prompt + completion ids; tool schemas are written once
    under their sha256. A multi-turn rollout's trace then grows with what is new, not with the whole history.
    """

    def __init__(self, window: int = 4) -> None:
        self._recent: list[_Written] = []
        self._window = window
        self._tools: list[tuple[Any, str]] = []

    def compact(
        self, turn: int, sent: dict[str, Any], prompt_ids: list[int], completion_ids: list[int]
    ) -> tuple[dict[str, Any], dict[str, Any], tuple[str, Any] | None]:
        """(request record, prompt-id fields, a new tool-schema blob to write first or None)."""
        messages = list(sent.get("messages") or [])
        request = {key: value for key, value in sent.items() if key not in ("messages", "tools")}
        base, shared = self._best(lambda earlier: common_prefix_length(earlier.messages, messages))
        request["messages_base"] = None if base is None else {"turn": base, "count": shared}
        request["messages"] = messages[shared:]
        blob = None
        if sent.get("tools"):
            sha, blob = self._tools_sha(sent["tools"])
            request["tools_sha256"] = sha
        prompt_base, prompt_shared = self._best(lambda earlier: common_prefix_length(earlier.token_ids, prompt_ids))
        prompt = {
            "prompt_base": None if prompt_base is None else {"turn": prompt_base, "count": prompt_shared},
            "prompt_token_ids": prompt_ids[prompt_shared:],
        }
        self._recent = [*self._recent[-(self._window - 1) :], _Written(turn, messages, prompt_ids + completion_ids)]
        return request, prompt, blob

    def _best(self, measure: Any) -> tuple[int | None, int]:
        best_turn, best = None, 0
        for earlier in reversed(self._recent):
            shared = measure(earlier)
            if shared > best:
                best_turn, best = earlier.turn, shared
        return best_turn, best

    def _tools_sha(self, tools: Any) -> tuple[str, tuple[str, Any] | None]:
        for known, sha in self._tools:
            if known == tools:
                return sha, None
        sha = hashlib.sha256(json.dumps(tools, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        self._tools.append((tools, sha))
        return sha, (sha, tools)
