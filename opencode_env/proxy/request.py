"""The request side of capture: what goes upstream, and what a turn's record says of the agent's request.

Pure, like capture.py: the rewrite (the real model, one completion, logprobs asked for, max tokens capped), the
knobs held to one completion, the kind of a call and its recorded headers, and the error body OpenCode is given in
place of an upstream rejection it would retry.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

EndpointKind = Literal["vllm", "openai", "hf_router", ""]

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
    sampling: tuple[tuple[str, Any], ...] = ()
    """Sampling parameters set on every call, overriding the agent's (OpenCode sends none)."""
    return_token_ids: bool | None = None
    """Ask for `return_token_ids` (vLLM >= 0.10.2); None: for a vllm endpoint only. The endpoint probe sets it for
    any server it saw accept the field (a custom base_url included)."""

    def asks_token_ids(self) -> bool:
        return self.endpoint_kind == "vllm" if self.return_token_ids is None else self.return_token_ids


@dataclass(frozen=True)
class Clamp:
    """A request knob held to one completion: a value other than `neutral` (or null) is sent as `neutral`, or
    removed when `remove` (the upstream's default is then one completion)."""

    neutral: int | bool
    remove: bool

    def allows(self, value: Any) -> bool:
        return value is None or (type(value) is type(self.neutral) and value == self.neutral)


ONE_COMPLETION = {
    "n": Clamp(neutral=1, remove=False),
    "best_of": Clamp(neutral=1, remove=True),
    "use_beam_search": Clamp(neutral=False, remove=True),
}
"""The knobs that make one call cost several completions or return one that was not sampled, so its record would
be wrong (vLLM's ChatCompletionRequest and SamplingParams, OpenAI's chat completions).

- `n` (OpenAI, vLLM, SGLang, the router's providers): n choices, each generated and billed on the server's key;
  the fold records choice 0 only. Sent as 1.
- `best_of` (vLLM, SGLang): best_of candidates generated server-side and the highest-logprob one returned: a
  selection, not a sample of the policy, at best_of times the cost. Removed.
- `use_beam_search` (vLLM, SGLang): beam search of width n (or best_of): a search result whose per-token logprobs
  describe no sampling. Removed.

There is no `num_beams` or `beam_width` field in these chat APIs (vLLM derives its beam width from `n`). Knobs that
reshape the distribution but still return the sampled tokens with their ids and logprobs (temperature, top_p,
logit_bias, guided decoding, response_format) are forwarded: they are the agent's sampling choices, and OpenCode's
own features depend on some of them.
"""


PROXY_ONLY_FIELDS = ("kv_transfer_params", "tokens")
"""Fields that hand the engine a prompt other than the messages' (token_in.py sets them on the token-in routes) or,
on a disaggregated vLLM, tell its KV connector where to fetch a prefill from: never taken from the agent's request."""


def clamped_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The knobs of ONE_COMPLETION that `rewrite_request` overrides in `body`, with the values the agent sent."""
    return {name: body[name] for name, clamp in ONE_COMPLETION.items() if name in body and not clamp.allows(body[name])}


def _hold_to_one_completion(out: dict[str, Any]) -> None:
    for name in clamped_fields(out):
        clamp = ONE_COMPLETION[name]
        if clamp.remove:
            del out[name]
        else:
            out[name] = clamp.neutral


def uses_max_completion_tokens(model: str) -> bool:
    """o-series and gpt-5 models reject `max_tokens` and refuse logprobs."""
    return bool(_MAX_COMPLETION_TOKENS_MODELS.search(model))


def rewrite_request(body: dict[str, Any], config: RewriteConfig) -> dict[str, Any]:
    """The request as sent upstream: the real model, one completion, logprobs asked for, max tokens capped, thinking
    as configured."""
    out = {name: value for name, value in body.items() if name not in PROXY_ONLY_FIELDS}
    _hold_to_one_completion(out)
    out.update(config.sampling)
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
    if config.asks_token_ids():
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


SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)
_SKIPPED_HEADERS = frozenset({"host", "content-length", "connection", "accept-encoding", "accept"})


def recorded_headers(headers: dict[str, str]) -> dict[str, str]:
    return {
        name.lower(): "[redacted]" if SECRET_HEADER.search(name) else value
        for name, value in headers.items()
        if name.lower() not in _SKIPPED_HEADERS
    }


COMPACTION_MARKER = "context summarization agent"


def turn_kind(body: dict[str, Any], headers: dict[str, str]) -> Literal["agent", "auxiliary", "sub_agent"]:
    """Sub-agent calls by header; calls without tools (titles, summaries) and OpenCode's compaction call (its
    system prompt says what it is) are auxiliary: trainers skip them."""
    if headers.get("x-rlm-role", "").lower() == "sub":
        return "sub_agent"
    if not body.get("tools") or _is_compaction(body):
        return "auxiliary"
    return "agent"


def _is_compaction(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return False
    first = messages[0]
    content = first.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return first.get("role") == "system" and COMPACTION_MARKER in text
