"""The endpoint probe: before any sandbox starts, a few small calls (the capture proxy's own rewrite and fold) show
what the model server can capture: token ids, logprobs and whether they are the sampler's, tool calls, the model's
identity, the template's fingerprint, the token-in routes. A request the endpoint cannot serve is refused with the
fix; what is degraded becomes a warning. Pure core (`decide`, `capabilities_of`, `logprobs_kind`) and a thin shell
(`probe_endpoint`), cached per server, model and key digest for `PROBE_TTL_S`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from opencode_env.proxy.capture import Fold, fold_stream
from opencode_env.proxy.completions import server_root
from opencode_env.proxy.fingerprint import PROBE_HEADER, fingerprint, tokenize_body
from opencode_env.proxy.request import RewriteConfig, rewrite_request
from opencode_env.proxy.token_in import ROUTES, Route, rendered_suffix, request_body, routed_body
from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.preflight.probe_diagnosis import raise_if_misaddressed, raise_if_unreachable
from opencode_env.wire.notices import Notice
from opencode_env.wire.provenance import (
    Capture,
    EndpointCapabilities,
    EndpointProbe,
    LogprobsKind,
    ModelIdentity,
    TokenInSupport,
)
from opencode_env.wire.request import TokenIn

PROBE_TTL_S = 600.0
CALL_TIMEOUT_S = 30.0
PROBE_MAX_TOKENS = 4
HOT, COOL = 1.0, 0.5
"""The two temperatures whose logprobs are compared: equal at both, the server returns the model's raw ones."""

IDS_FIX = (
    "for vLLM: use 0.10.2 or later (it answers `return_token_ids`, which the capture proxy asks for), or start it "
    "with --return-tokens-as-token-ids (completion ids only); OpenAI and the Hugging Face router return no token "
    "ids at all: use capture='logprobs' or capture='text'"
)
PROMPT_IDS_FIX = (
    "for vLLM: use 0.10.2 or later (`return_token_ids` returns the prompt ids); without them no training sequence "
    "can be built: use capture='logprobs' or capture='text'"
)
LOGPROBS_FIX = (
    "for vLLM: start it with --max-logprobs at least the request's top_logprobs; OpenAI's reasoning models (o-series, "
    "gpt-5) refuse logprobs: use another model, or capture='text'"
)
RAW_FIX = "start vLLM with --logprobs-mode processed_logprobs"
TOOLS_FIX = "for vLLM: start it with --enable-auto-tool-choice and the model's --tool-call-parser"
NO_CALL_CAUSE = (
    "a model that does not call tools, or for vLLM a --tool-call-parser that does not read this model's format "
    "(without --enable-auto-tool-choice vLLM refuses the request instead)"
)

PROBE_MESSAGES = [{"role": "user", "content": "Reply with the single word: ok"}]
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_echo",
        "description": "Echo a word back.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
TOOL_MESSAGES = [{"role": "user", "content": "Call the probe_echo tool with the word ok."}]
TOOL_RESULT = "ok"
AGAIN = {"role": "user", "content": "Call the probe_echo tool again, with the word ok."}
CUT_REPLY = "turn 1's reply ended without its stop token"
"""The probe's suffix is then not rendered (the proxy renders none after such a reply either): no fault of the
template's, so no warning."""
TOKEN_IN_FIX = (
    "serve the model with vLLM 0.32 or later (its /v1/chat/completions takes kv_transfer_params.prompt_token_ids) or "
    "prime-rl's vLLM server (/v1/chat/completions/tokens), with /tokenize reachable at the server's root; or pass "
    "token_in='auto' to run with the chat template where no route is proven (each turn records why; a fork then "
    "splits the session and the TRL row holds its last part only)"
)


def capabilities_of(fold: Fold, *, return_token_ids: bool) -> EndpointCapabilities:
    """What one folded answer shows the endpoint returns."""
    alternatives = [entry for position in fold.top_logprobs for entry in position]
    return EndpointCapabilities(
        completion_token_ids=bool(fold.ids()),
        prompt_token_ids=bool(fold.prompt_token_ids),
        logprobs=bool(fold.logprobs),
        top_logprob_ids=bool(alternatives) and all(entry[2] is not None for entry in alternatives),
        token_id_source=fold.token_id_source(),
        return_token_ids=return_token_ids,
    )


def logprobs_kind(hot: Fold, cool: Fold) -> LogprobsKind:
    """Raw or processed, from the first position's most likely token at two temperatures: a server that applies
    the temperature to the logprobs it returns changes them, one that returns the model's own does not."""
    if not hot.top_logprobs or not cool.top_logprobs or not hot.top_logprobs[0] or not cool.top_logprobs[0]:
        return "unknown"
    at_hot = {token: logprob for token, logprob, _ in hot.top_logprobs[0]}
    at_cool = {token: logprob for token, logprob, _ in cool.top_logprobs[0]}
    shared = [token for token in at_hot if token in at_cool]
    if not shared:
        return "unknown"
    likeliest = max(shared, key=lambda token: at_hot[token])
    if abs(at_hot[likeliest]) < 1e-6:
        return "unknown"
    return "raw" if abs(at_hot[likeliest] - at_cool[likeliest]) <= 1e-6 else "processed"


@dataclass(frozen=True)
class Decision:
    refusal: str | None
    warnings: list[Notice]


def decide(
    probe: EndpointProbe, capture: Capture, *, top_logprobs: int, shaped_sampling: bool, token_in: TokenIn = "off"
) -> Decision:
    """Refuse the rollout when the endpoint cannot give what `capture` (or `token_in="require"`) needs; warn of
    whatever else is degraded. `shaped_sampling`: the request's sampling changes the distribution (where raw
    logprobs are not the sampler's)."""
    decision = _decide_capture(probe, capture, shaped_sampling=shaped_sampling)
    if decision.refusal is not None or token_in == "off":
        return decision
    support = probe.capabilities.token_in
    if not probe.probed or support is None or support.route == "unknown":
        why = probe.problem or "the endpoint was not probed for it"
        if token_in == "require":
            return Decision(f"token_in='require': token-in could not be checked ({why}): {TOKEN_IN_FIX}", [])
        unchecked = f"token-in not checked before the rollout ({why})"
        return Decision(
            None, [*decision.warnings, Notice(code="token_in_unchecked", severity="note", message=unchecked)]
        )
    if support.route == "none":
        if token_in == "require":
            return Decision(
                f"token_in='require': the server takes no prompt ids ({support.problem}): {TOKEN_IN_FIX}", []
            )
        # No warning under auto: where the template extends each turn the TRL row is whole anyway, and where it
        # does not, the result's trl_row_short says so with the fix; provenance and each turn record why.
        return decision
    if support.suffix not in ("rendered", CUT_REPLY):
        warning = (
            f"token-in: the probe's suffix was not rendered alone ({support.suffix}); turns whose new messages cannot "
            "be rendered after the last reply take the chat template, each recorded"
        )
        notice = Notice(code="token_in_suffix", severity="note", message=warning)
        return Decision(None, [*decision.warnings, notice])
    return decision


def _decide_capture(probe: EndpointProbe, capture: Capture, *, shaped_sampling: bool) -> Decision:
    if not probe.probed:
        if capture == "text":
            return Decision(None, [])
        unchecked = f"capture not checked before the rollout: {probe.problem}"
        return Decision(None, [Notice(code="capture_unchecked", severity="warning", message=unchecked)])
    if probe.problem is not None:
        if capture == "text":
            nothing = f"nothing can be captured: {probe.problem}"
            return Decision(None, [Notice(code="nothing_captured", severity="note", message=nothing)])
        return Decision(f"capture={capture!r}: {probe.problem}; pass capture='text' to run for the reward only", [])
    found = probe.capabilities
    if found.tools_refused is not None:
        return Decision(
            f"capture={capture!r}: the endpoint refuses a request that offers tools ({found.tools_refused}), and "
            f"OpenCode offers its tools on every call: {TOOLS_FIX}",
            [],
        )
    missing: list[str] = []
    if capture in ("tokens", "logprobs") and not found.logprobs:
        missing.append(f"per-token logprobs ({LOGPROBS_FIX})")
    if capture == "tokens" and not found.completion_token_ids:
        missing.append(f"completion token ids ({IDS_FIX})")
    if capture == "tokens" and not found.prompt_token_ids:
        missing.append(f"prompt token ids ({PROMPT_IDS_FIX})")
    if missing:
        return Decision(
            f"capture={capture!r}: the endpoint returns no {'; no '.join(missing)}; or pass capture='text' to run "
            "for the reward only",
            [],
        )
    warnings = []
    if not found.completion_token_ids and capture != "tokens" and probe.problem is None:
        message = f"the endpoint returns no token ids: these turns cannot be trained on ({IDS_FIX})"
        warnings.append(Notice(code="no_token_ids", severity="error", message=message, fix=IDS_FIX))
    if not found.logprobs and capture == "text":
        message = f"the endpoint returns no logprobs ({LOGPROBS_FIX})"
        warnings.append(Notice(code="no_logprobs", severity="note", message=message, fix=LOGPROBS_FIX))
    if found.logprobs_kind == "raw" and shaped_sampling:
        message = f"the endpoint returns raw logprobs, not the sampler's, under non-neutral sampling: {RAW_FIX}"
        warnings.append(Notice(code="raw_logprobs", severity="warning", message=message, fix=RAW_FIX))
    if found.tool_calls == "no":
        message = f"the model did not call a tool when asked to ({NO_CALL_CAUSE})"
        warnings.append(Notice(code="probe_no_tool_call", severity="warning", message=message, fix=TOOLS_FIX))
    if probe.template_fingerprint is None and capture == "tokens":
        message = "the chat template cannot be fingerprinted (the server has no /tokenize): a change is not seen"
        warnings.append(Notice(code="template_unfingerprinted", severity="note", message=message))
    return Decision(None, warnings)


@dataclass
class _Cached:
    probe: EndpointProbe
    at: float


_cache: dict[tuple[str, ...], _Cached] = {}
_running: dict[tuple[str, ...], asyncio.Task[EndpointProbe]] = {}


def cache_key(upstream: Upstream, top_logprobs: int, token_in: bool = False) -> tuple[str, ...]:
    key_digest = hashlib.sha256(upstream.api_key.encode()).hexdigest()[:16]
    return (
        str(token_in),
        upstream.base_url,
        upstream.model,
        upstream.endpoint,
        upstream.connect_address,
        str(upstream.disable_thinking),
        str(min(top_logprobs, 1)),
        key_digest,
    )


def forget_probes() -> None:
    """Empty the cache (tests, and an operator who restarted a model server under the same URL)."""
    _cache.clear()


async def probe_endpoint(
    upstream: Upstream,
    *,
    top_logprobs: int,
    proxy: str = "",
    clock: Callable[[], float] = time.time,
    ttl_s: float = PROBE_TTL_S,
    token_in: bool = False,
) -> EndpointProbe:
    """The endpoint's probe, from the cache while it is fresh; probes of one endpoint at once share one run. Only
    a probe the endpoint answered is cached. `token_in`: also the two-turn token-in check."""
    key = cache_key(upstream, top_logprobs, token_in)
    cached = _cache.get(key)
    if cached is not None and clock() - cached.at < ttl_s:
        return cached.probe.model_copy(update={"cached": True, "cost_s": 0.0})
    running = _running.get(key)
    if running is None or running.get_loop() is not asyncio.get_running_loop():
        running = asyncio.ensure_future(_probe(upstream, top_logprobs, proxy, clock, token_in))
        _running[key] = running
        running.add_done_callback(lambda _: _running.pop(key, None) if _running.get(key) is running else None)
        joined = False
    else:
        joined = True
    probe = await asyncio.shield(running)
    if probe.probed:
        _cache[key] = _Cached(probe, probe.probed_at)
    return probe.model_copy(update={"cached": True, "cost_s": 0.0}) if joined else probe


class _Client:
    """httpx toward the one vetted address: a caller's host name is never resolved again (see upstream_policy)."""

    def __init__(self, upstream: Upstream, proxy: str) -> None:
        self.upstream = upstream
        self.http = httpx.AsyncClient(timeout=CALL_TIMEOUT_S, trust_env=False, proxy=proxy or None)

    def _target(self, url: str) -> tuple[str, dict[str, str], dict[str, Any]]:
        headers = {PROBE_HEADER: "1"}
        if self.upstream.api_key:
            headers["authorization"] = f"Bearer {self.upstream.api_key}"
        address = self.upstream.connect_address
        if not address:
            return url, headers, {}
        parts = urlsplit(url)
        literal = f"[{address}]" if ":" in address else address
        netloc = literal + (f":{parts.port}" if parts.port else "")
        headers["host"] = parts.netloc
        extensions = {"sni_hostname": parts.hostname or ""} if parts.scheme == "https" else {}
        return urlunsplit(parts._replace(netloc=netloc)), headers, extensions

    async def get(self, url: str) -> httpx.Response:
        target, headers, extensions = self._target(url)
        return await self.http.get(target, headers=headers, extensions=extensions)

    async def post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        target, headers, extensions = self._target(url)
        return await self.http.post(target, json=body, headers=headers, extensions=extensions)


def _chat_body(upstream: Upstream, top_logprobs: int, temperature: float, *, ids: bool, tools: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": upstream.model,
        "messages": TOOL_MESSAGES if tools else PROBE_MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 64 if tools else PROBE_MAX_TOKENS,
        "temperature": temperature,
        "seed": 0,
    }
    if tools:
        body["tools"] = [PROBE_TOOL]
    config = RewriteConfig(
        endpoint_kind=upstream.endpoint,
        model_override=upstream.model,
        top_logprobs=max(top_logprobs, 2),
        max_tokens_cap=body["max_tokens"],
        disable_thinking=upstream.disable_thinking,
        return_token_ids=ids,
    )
    return rewrite_request(body, config)


def _refused(response: httpx.Response) -> str:
    text = response.text[:300].replace("\n", " ")
    return f"HTTP {response.status_code}: {text}"


async def _probe(
    upstream: Upstream, top_logprobs: int, proxy: str, clock: Callable[[], float], token_in: bool
) -> EndpointProbe:
    started = time.monotonic()
    client = _Client(upstream, proxy)
    chat = f"{upstream.base_url}/chat/completions"
    try:
        identity, template = await asyncio.gather(_identity(client), _template(client))
        asks_ids = True
        answer = await client.post(chat, _chat_body(upstream, top_logprobs, HOT, ids=True, tools=False))
        if answer.status_code in (400, 422):
            asks_ids = False
            answer = await client.post(chat, _chat_body(upstream, top_logprobs, HOT, ids=False, tools=False))
        if answer.status_code != 200:
            await raise_if_misaddressed(upstream, answer, client.get)
            problem = f"the endpoint refused the probe's capture request: {_refused(answer)}"
            return _unprobed(problem, clock, started) if answer.status_code >= 500 else _refusing(problem, clock)
        hot = fold_stream(answer.content)
        tool_body = _chat_body(upstream, top_logprobs, HOT, ids=asks_ids, tools=True)
        cool_answer, tool_answer = await asyncio.gather(
            client.post(chat, _chat_body(upstream, top_logprobs, COOL, ids=asks_ids, tools=False)),
            client.post(chat, tool_body),
        )
        found = capabilities_of(hot, return_token_ids=asks_ids)
        if cool_answer.status_code == 200:
            found.logprobs_kind = logprobs_kind(hot, fold_stream(cool_answer.content))
        tool_fold = fold_stream(tool_answer.content) if tool_answer.status_code == 200 else None
        if tool_fold is not None:
            found.tool_calls = "yes" if tool_fold.tool_calls else "no"
        elif tool_answer.status_code in (400, 422):
            found.tool_calls = "no"
            found.tools_refused = _refused(tool_answer)
        if token_in:
            found.token_in = await _token_in(client, tool_body, tool_fold, found)
    except httpx.HTTPError as error:
        raise_if_unreachable(upstream, error, CALL_TIMEOUT_S)
        return _unprobed(f"the endpoint did not answer the probe: {type(error).__name__}: {error}", clock, started)
    finally:
        await client.http.aclose()
    return EndpointProbe(
        probed=True,
        capabilities=found,
        model=identity,
        template_fingerprint=template,
        probed_at=clock(),
        cost_s=round(time.monotonic() - started, 4),
    )


async def _token_in(
    client: _Client, body: dict[str, Any], first: Fold | None, found: EndpointCapabilities
) -> TokenInSupport:
    """Which route takes a prompt as ids, proven by a second turn.

    Turn 1 is the tool probe (the chat template renders it). Turn 2's ids are turn 1's prompt + completion ids and
    the ids the server's /tokenize gives the messages that follow (the reply, then its tool result or a user message
    asking for the tool again), exactly as the capture proxy builds them; where the template cannot render that
    suffix alone, its own render of turn 2 is sent instead (and the suffix's problem recorded). Turn 2 is sent by
    each route in turn with turn 1's messages, so ids echoed equal to the ones sent can only come from the ids: a
    server that ignores them echoes its render of turn 1. A route is proven when its answer echoes the ids exactly
    and still parses a tool call where the chat route parsed one; the first proven route is the one used."""
    support = TokenInSupport()
    if first is None or not first.prompt_token_ids or not first.ids():
        support.route, support.problem = "none", "the server returned no prompt and completion ids for a tool request"
        return support
    history = [*TOOL_MESSAGES, _reply_message(first)]
    follow = [
        {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT} for call in history[-1]["tool_calls"]
    ]
    messages = [*history, *(follow or [AGAIN])]
    full = await _tokenize(client, request_body(body, messages, generation_prompt=True))
    if isinstance(full, str):
        support.route, support.problem = "none", f"the new messages' ids cannot be rendered: {full}"
        return support
    if first.finish_reason in ("stop", "tool_calls"):
        suffix = await rendered_suffix(
            body, messages, len(history), first.ids()[-1], lambda request: _tokenize(client, request)
        )
    else:
        suffix = CUT_REPLY
    support.suffix = "rendered" if isinstance(suffix, list) else suffix
    ids = first.prompt_token_ids + first.ids() + suffix if isinstance(suffix, list) else full
    for route in ROUTES:
        verdict, proven = await _token_in_turn(client, body, route, ids, first=first, found=found)
        if route == "tokens":
            support.tokens_route = verdict
        else:
            support.forwarded_ids = verdict
        if proven:
            support.route = route
            return support
    support.route = "none"
    support.problem = f"token route: {support.tokens_route}; forwarded ids: {support.forwarded_ids}"
    return support


async def _token_in_turn(
    client: _Client, body: dict[str, Any], route: Route, ids: list[int], *, first: Fold, found: EndpointCapabilities
) -> tuple[str, bool]:
    """What sending turn 2 as `ids` by `route` showed, and whether it proves the route."""
    path, routed = routed_body(body, route, ids)
    answer = await client.post(f"{client.upstream.base_url}{path}", routed)
    if answer.status_code == 404:
        return "absent (HTTP 404)", False
    if answer.status_code != 200:
        return f"refused ({_refused(answer)})", False
    second = fold_stream(answer.content)
    echoed = second.prompt_token_ids
    if not echoed:
        return "answered without prompt ids, so the ids cannot be checked", False
    if echoed == first.prompt_token_ids:
        return "ignored: the server rendered the messages instead (it echoed its own render)", False
    if echoed != ids:
        parted = next(
            (at for at, (a, b) in enumerate(zip(echoed, ids, strict=False)) if a != b), min(len(echoed), len(ids))
        )
        return f"other ids echoed ({len(echoed)} for {len(ids)} sent, parting at {parted})", False
    if second.tool_calls:
        return f"ids echoed exactly ({len(ids)}), tool call parsed", True
    if found.tool_calls == "yes":
        return "ids echoed exactly, but no tool call parsed where the chat route parsed one", False
    return f"ids echoed exactly ({len(ids)}); tool parsing not shown (the model called no tool by either route)", True


def _reply_message(fold: Fold) -> dict[str, Any]:
    """Turn 1's reply as a client appends it to the history: its text and parsed tool calls."""
    calls = [
        {
            "id": call["id"] or f"call_probe_{index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
        for index, call in enumerate(fold.tool_calls[key] for key in sorted(fold.tool_calls))
    ]
    return {"role": "assistant", "content": "".join(fold.content), "tool_calls": calls}


async def _tokenize(client: _Client, body: dict[str, Any]) -> list[int] | str:
    root = urlsplit(client.upstream.base_url)
    url = urlunsplit(root._replace(path=server_root(root.path.rstrip("/")) + "/tokenize"))
    answer = await client.post(url, body)
    try:
        parsed = answer.json() if answer.status_code == 200 else None
    except json.JSONDecodeError:
        parsed = None
    tokens = parsed.get("tokens") if isinstance(parsed, dict) else None
    if isinstance(tokens, list) and tokens and all(type(token) is int for token in tokens):
        return tokens
    return f"/tokenize with messages answered {_refused(answer)}"


def _unprobed(problem: str, clock: Callable[[], float], started: float) -> EndpointProbe:
    return EndpointProbe(probed=False, problem=problem, probed_at=clock(), cost_s=round(time.monotonic() - started, 4))


def _refusing(problem: str, clock: Callable[[], float]) -> EndpointProbe:
    """The endpoint answered, and refused what capture asks of every call: nothing can be captured."""
    return EndpointProbe(probed=True, problem=problem, probed_at=clock())


async def _identity(client: _Client) -> ModelIdentity | None:
    try:
        answer = await client.get(f"{client.upstream.base_url}/models")
        listed = answer.json().get("data") if answer.status_code == 200 else None
    except (httpx.HTTPError, json.JSONDecodeError, AttributeError):
        return None
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and entry.get("id") == client.upstream.model:
            length = entry.get("max_model_len")
            root, owner = entry.get("root"), entry.get("owned_by")
            return ModelIdentity(
                id=str(entry["id"]),
                root=str(root) if root is not None else None,
                max_model_len=length if type(length) is int else None,
                owned_by=str(owner) if owner is not None else None,
            )
    return None


async def _template(client: _Client) -> str | None:
    root = urlsplit(client.upstream.base_url)
    url = urlunsplit(root._replace(path=server_root(root.path.rstrip("/")) + "/tokenize"))
    try:
        answer = await client.post(url, tokenize_body(client.upstream.model))
        tokens = answer.json().get("tokens") if answer.status_code == 200 else None
    except (httpx.HTTPError, json.JSONDecodeError, AttributeError):
        return None
    if isinstance(tokens, list) and tokens and all(type(token) is int for token in tokens):
        return fingerprint(tokens)
    return None
