"""The scripted model: a real OpenAI-compatible HTTP server that plays a `Script` the way vLLM streams.

It plays each kind of server token-in meets (see opencode_env/proxy/token_in.py): with `token_routes` prime-rl's
`/v1/chat/completions/tokens`; with `forwarded_ids="on"` stock vLLM's chat route taking
`kv_transfer_params.prompt_token_ids` (ignored with `echo` or a non-text content part, as vLLM 0.32 does), or
`"unparsed"` a server that takes them but then leaves tool calls unparsed (as text), or `"refused"` one that answers
400 to the field (a server that forbids unknown fields); by default neither (the ids are ignored and the messages
rendered, as a server without the mechanism does).

Faithful where capture depends on it: one token per chunk, a role delta first (with `prompt_token_ids` when
`return_token_ids` is asked), tool-call deltas with argument fragments, the EOS token carrying `finish_reason`,
a usage chunk with `choices: []`, then `[DONE]`. `top_logprobs[0]` is the sampled token and is not always the most
likely. Every exchange is logged with the exact bytes sent, so tests compare capture against the source.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from opencode_env.proxy.fingerprint import PROBE_HEADER
from opencode_env.scripted.chat_template import (
    EOS,
    Segment,
    TemplateVariant,
    assistant_body,
    prompt_token_ids,
    token_id,
)
from opencode_env.scripted.chat_template import tokenize_segments as _tokenize
from opencode_env.scripted.script import Script, Step, ToolCallStep
from opencode_env.scripted.threaded_server import ThreadedServer

POLICY_VERSION_HEADER = "x-policy-version"
TOOLS_REFUSED = {
    "error": {
        "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
"""vLLM 0.32's answer to a request offering tools when it was started without --enable-auto-tool-choice."""
_ALTERNATIVES = [" the", " a", "(", "x", " return", "\n", " def", ".", "_", " and", " is", "0"]


@dataclass(frozen=True)
class PlannedToken:
    text: str
    token_id: int
    logprob: float
    alternatives: tuple[tuple[str, int, float], ...]
    segment: Segment


@dataclass
class Exchange:
    """One request the model answered, with what it sent."""

    serial: int
    request: dict[str, Any]
    headers: dict[str, str]
    status: int = 200
    prompt_token_ids: list[int] = field(default_factory=list)
    tokens: list[PlannedToken] = field(default_factory=list)
    sent: bytearray = field(default_factory=bytearray)
    finished: bool = False
    prompt_from: Literal["template", "tokens", "forwarded"] = "template"
    tools_parsed: bool = True


def plan_tokens(step: Step, rng: random.Random, top_k: int) -> list[PlannedToken]:
    calls = [(call.name, call.arguments_json()) for call in step.tool_calls]
    segments = [*assistant_body(step.content, calls, step.reasoning), Segment(EOS, "special")]
    planned: list[PlannedToken] = []
    for text, tid, segment in _tokenize(segments):
        sampled = -round(rng.uniform(0.0001, 2.5), 12) + rng.random() * 1e-9
        alternatives = []
        for alt_text in rng.sample(_ALTERNATIVES, k=min(max(top_k - 1, 0), len(_ALTERNATIVES))):
            more_likely = rng.random() < 0.3
            alt_logprob = sampled + rng.uniform(0.01, 0.5) if more_likely else sampled - rng.uniform(0.01, 3.0)
            alternatives.append((alt_text, token_id(alt_text), min(alt_logprob, 0.0)))
        planned.append(PlannedToken(text, tid, sampled, tuple(alternatives), segment))
    return planned


def _float32(token: PlannedToken) -> PlannedToken:
    def narrowed(value: float) -> float:
        return array("f", [value])[0]

    alternatives = tuple((text, tid, narrowed(logprob)) for text, tid, logprob in token.alternatives)
    return PlannedToken(token.text, token.token_id, narrowed(token.logprob), alternatives, token.segment)


def _finish_reason(step: Step) -> str:
    return "tool_calls" if step.tool_calls else "stop"


def _logprob_entry(token: PlannedToken, as_ids: bool, top_k: int) -> dict[str, Any]:
    def shown(text: str, tid: int) -> str:
        return f"token_id:{tid}" if as_ids else text

    top = [(token.text, token.token_id, token.logprob), *token.alternatives][:top_k]
    return {
        "token": shown(token.text, token.token_id),
        "logprob": token.logprob,
        "bytes": list(token.text.encode("utf-8")),
        "top_logprobs": [
            {"token": shown(text, tid), "logprob": logprob, "bytes": list(text.encode("utf-8"))}
            for text, tid, logprob in top
        ],
    }


def chunk_groups(step: Step, tokens: list[PlannedToken]) -> list[tuple[int, list[PlannedToken]]]:
    """The tokens of each streamed chunk, with the position of its first: up to `step.tokens_per_chunk` tokens of
    one segment, a new chunk wherever the step stalls or disconnects."""
    cuts = {step.stall_after_tokens, step.disconnect_after_tokens}
    groups: list[tuple[int, list[PlannedToken]]] = []
    for position, token in enumerate(tokens):
        if groups:
            _, group = groups[-1]
            if len(group) < step.tokens_per_chunk and group[-1].segment is token.segment and position not in cuts:
                group.append(token)
                continue
        groups.append((position, [token]))
    return groups


TOOL_SEGMENTS = ("tool_head", "tool_args", "tool_tail")


def _delta(
    token: PlannedToken, step: Step, first_of_call: bool, serial: int, text: str, *, tools_parsed: bool = True
) -> dict[str, Any]:
    """The delta of a chunk that starts with `token`; `text`: the chunk's tokens' text (one segment's). Without
    `tools_parsed` a tool call's text is content, as a server whose tool parser did not run sends it."""
    segment = token.segment
    if segment.kind == "content" or (not tools_parsed and segment.kind in TOOL_SEGMENTS):
        return {"content": text}
    if segment.kind == "reasoning":
        return {"reasoning_content": text}
    if segment.kind == "tool_head" and first_of_call:
        call = step.tool_calls[segment.tool_index]
        return {
            "tool_calls": [
                {
                    "index": segment.tool_index,
                    "id": f"call_{serial}_{segment.tool_index}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
        }
    if segment.kind == "tool_args":
        return {"tool_calls": [{"index": segment.tool_index, "function": {"arguments": text}}]}
    return {}


def not_served(model: object) -> dict[str, Any]:
    """vLLM's answer (404) to a model it does not serve: a wrong name never runs a rollout against another model."""
    message = f"The model `{model}` does not exist."
    return {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}


class ScriptedModel:
    """The model's state: scripts per agent session, and the log of every exchange."""

    def __init__(
        self,
        script: Script,
        *,
        model_name: str = "scripted-policy",
        seed: int = 7,
        token_routes: bool = False,
        sub_script: Script | None = None,
        tokenize: bool = True,
        omit_token_ids: bool = False,
        omit_logprobs: bool = False,
        logprobs_mode: Literal["raw", "processed"] = "raw",
        template_switch_after: int | None = None,
        policy_version: str = "",
        refuse_tools: bool = False,
        float32_logprobs: bool = False,
        forwarded_ids: Literal["off", "on", "unparsed", "refused"] = "off",
        template: TemplateVariant = "chatml",
        any_model: bool = False,
    ) -> None:
        self.script = script
        self.any_model = any_model
        """Answer every model name (a stand-in whose name does not matter); else another name is vLLM's 404."""
        self.forwarded_ids = forwarded_ids
        """Whether the chat route takes `kv_transfer_params.prompt_token_ids` (see the module's docstring)."""
        self.float32_logprobs = float32_logprobs
        """Every logprob a float32 value, as vLLM computes them (by default, float64 values no float32 holds)."""
        self.refuse_tools = refuse_tools
        """Like vLLM started without --enable-auto-tool-choice: a request that offers tools is answered 400."""
        self.sub_script = sub_script
        """Played in every session after the first (sub-agents OpenCode's task tool starts); None: the script."""
        self._first_session: str | None = None
        self.model_name = model_name
        self.exchanges: list[Exchange] = []
        self._cursors: dict[str, int] = {}
        self._seed = seed
        self.omit_token_ids = omit_token_ids
        """Like an OpenAI-compatible server without vLLM's `return_token_ids` (and without its token-id strings)."""
        self.omit_logprobs = omit_logprobs
        self.logprobs_mode = logprobs_mode
        """raw: the logprobs ignore the temperature (vLLM's default); processed: they are scaled by it."""
        self.template: TemplateVariant = template
        self.template_switch_after = template_switch_after
        """The template becomes chatml_colon once this many per-call template checks (the capture proxy's) came."""
        self.template_checks = 0
        self.policy_version = policy_version
        """Sent in POLICY_VERSION_HEADER on every answer, as an engine that reports its weights' version does."""
        self.probe_exchanges: list[Exchange] = []
        """The endpoint probe's calls (PROBE_HEADER): answered without moving any script, kept apart."""
        routes = [
            Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]
        if token_routes:
            routes.append(Route("/v1/chat/completions/tokens", self._chat_completions, methods=["POST"]))
        if token_routes or tokenize:
            routes.append(Route("/tokenize", self._tokenize, methods=["POST"]))
        self.tokenize_requests: list[dict[str, Any]] = []
        self.app = Starlette(routes=routes)

    def _next_step(self, session: str, request: dict[str, Any]) -> Step:
        if not request.get("tools"):
            return Step(content=self.script.title)
        self._first_session = self._first_session or session
        script = self.sub_script if self.sub_script and session != self._first_session else self.script
        index = self._cursors.get(session, 0)
        self._cursors[session] = index + 1
        return script.steps[index] if index < len(script.steps) else Step(content=script.final_text)

    async def _tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize for chat messages: the ids the template gives, with or without the generation prompt."""
        body = json.loads(await request.body())
        probe = request.headers.get(PROBE_HEADER)
        if probe is None:
            self.tokenize_requests.append(body)
        elif probe == "template":
            if self.template_switch_after is not None and self.template_checks >= self.template_switch_after:
                self.template = "chatml_colon"
            self.template_checks += 1
        generation_prompt = bool(body.get("add_generation_prompt", True))
        tokens = prompt_token_ids(body.get("messages", []), generation_prompt=generation_prompt, variant=self.template)
        return JSONResponse({"count": len(tokens), "max_model_len": 131_072, "tokens": tokens, "token_strs": None})

    async def _models(self, _: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _chat_completions(self, request: Request) -> Response:
        body = json.loads(await request.body())
        headers = {key.lower(): value for key, value in request.headers.items()}
        probing = PROBE_HEADER in headers
        exchanges = self.probe_exchanges if probing else self.exchanges
        exchange = Exchange(serial=len(exchanges), request=body, headers=headers)
        exchanges.append(exchange)
        if self.omit_token_ids:
            body = {
                key: value
                for key, value in body.items()
                if key not in ("return_token_ids", "return_tokens_as_token_ids")
            }
        if self.omit_logprobs:
            body = {key: value for key, value in body.items() if key not in ("logprobs", "top_logprobs")}
        if body.get("model") != self.model_name and not self.any_model:
            return self._error(exchange, Step(status=404, error_body=not_served(body.get("model"))))
        refused = self._forwarded_refused(body)
        if refused is not None:
            return self._error(exchange, Step(status=400, error_body={"error": {"message": refused, "code": 400}}))
        if self.refuse_tools and body.get("tools") and body.get("tool_choice", "auto") != "none":
            step = Step(status=400, error_body=TOOLS_REFUSED)
        elif probing:
            step = _probe_step(body)
        else:
            step = self._next_step(headers.get("x-session-id", "default"), body)
        if step.stall_before_s:
            await asyncio.sleep(step.stall_before_s)
        if step.status != 200:
            return self._error(exchange, step)
        top_k = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
        rng = random.Random(self._seed * 1_000_003 + (-1 if probing else len(self.exchanges)))
        exchange.tokens = self._processed(plan_tokens(step, rng, top_k=max(top_k, 1)), body.get("temperature"))
        if self.float32_logprobs:
            exchange.tokens = [_float32(token) for token in exchange.tokens]
        tokens = body.get("tokens")
        forwarded = self._forwarded(body)
        if request.url.path.endswith("/tokens"):
            if not isinstance(tokens, list) or not all(type(token) is int for token in tokens):
                return JSONResponse({"error": {"message": "tokens: a list of token ids is required"}}, 400)
            exchange.prompt_token_ids, exchange.prompt_from = list(tokens), "tokens"
        elif forwarded is not None:
            exchange.prompt_token_ids, exchange.prompt_from = list(forwarded), "forwarded"
            exchange.tools_parsed = self.forwarded_ids != "unparsed"
        else:
            exchange.prompt_token_ids = prompt_token_ids(body.get("messages", []), variant=self.template)
        versioned = {POLICY_VERSION_HEADER: self.policy_version} if self.policy_version else {}
        if body.get("stream"):
            stream = self._stream(exchange, step, body)
            return StreamingResponse(stream, media_type="text/event-stream", headers=versioned)
        answer = self._complete(exchange, step, body)
        answer.headers.update(versioned)
        return answer

    def _forwarded(self, body: dict[str, Any]) -> list[Any] | None:
        """The forwarded prompt ids this server takes from `body`, or None (none sent, or not taken)."""
        forwarded = body.get("kv_transfer_params")
        ids = forwarded.get("prompt_token_ids") if isinstance(forwarded, dict) else None
        if self.forwarded_ids == "off" or ids is None or body.get("echo"):
            return None
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and any(
                isinstance(part, dict) and part.get("type", "text") != "text" for part in content
            ):
                return None
        return ids if isinstance(ids, list) else []

    def _forwarded_refused(self, body: dict[str, Any]) -> str | None:
        """A 400's message for forwarded ids this server refuses (before any script step is played), or None."""
        forwarded = body.get("kv_transfer_params")
        if not isinstance(forwarded, dict) or "prompt_token_ids" not in forwarded:
            return None
        if self.forwarded_ids == "refused":
            return "kv_transfer_params: Extra inputs are not permitted"
        ids = self._forwarded(body)
        if ids is not None and (not ids or not all(type(token) is int and token >= 0 for token in ids)):
            return "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers."
        return None

    def _processed(self, planned: list[PlannedToken], temperature: Any) -> list[PlannedToken]:
        """Processed logprobs depend on the temperature (a toy scaling: what matters is that they change)."""
        if self.logprobs_mode == "raw" or not isinstance(temperature, int | float) or temperature in (0, 1):
            return planned
        return [
            PlannedToken(
                token.text,
                token.token_id,
                token.logprob / temperature,
                tuple((text, tid, logprob / temperature) for text, tid, logprob in token.alternatives),
                token.segment,
            )
            for token in planned
        ]

    def _error(self, exchange: Exchange, step: Step) -> Response:
        exchange.status = step.status
        headers = {}
        if step.retry_after_s is not None:
            headers["retry-after"] = str(step.retry_after_s)
            headers["retry-after-ms"] = str(int(step.retry_after_s * 1000))
        content = json.dumps(step.error_body or {"error": {"message": "error"}}).encode()
        exchange.sent.extend(content)
        exchange.finished = True
        return Response(content, status_code=step.status, headers=headers, media_type="application/json")

    def _chunk(self, exchange: Exchange, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{id(exchange):x}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            **extra,
        }

    def _event(self, exchange: Exchange, payload: dict[str, Any] | str) -> bytes:
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        raw = f"data: {data}\n\n".encode()
        exchange.sent.extend(raw)
        return raw

    async def _stream(self, exchange: Exchange, step: Step, body: dict[str, Any]) -> AsyncIterator[bytes]:
        want_logprobs = bool(body.get("logprobs"))
        top_k = int(body.get("top_logprobs") or 0)
        want_ids = bool(body.get("return_token_ids"))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        first: dict[str, Any] = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        extra = {"prompt_token_ids": exchange.prompt_token_ids} if want_ids else {}
        yield self._event(exchange, self._chunk(exchange, [first], **extra))
        seen_calls: set[int] = set()
        for position, group in chunk_groups(step, exchange.tokens):
            if step.disconnect_after_tokens is not None and position == step.disconnect_after_tokens:
                return
            if step.stall_after_tokens is not None and position == step.stall_after_tokens:
                await asyncio.sleep(step.stall_s)
            if step.token_delay_s:
                await asyncio.sleep(step.token_delay_s)
            token = group[0]
            first_of_call = token.segment.tool_index not in seen_calls
            if token.segment.kind == "tool_head":
                seen_calls.add(token.segment.tool_index)
            last = position + len(group) == len(exchange.tokens)
            choice: dict[str, Any] = {
                "index": 0,
                "delta": _delta(
                    token,
                    step,
                    first_of_call,
                    exchange.serial,
                    "".join(t.text for t in group),
                    tools_parsed=exchange.tools_parsed,
                ),
                "logprobs": {"content": [_logprob_entry(t, as_ids, top_k) for t in group]} if want_logprobs else None,
                "finish_reason": (_finish_reason(step) if exchange.tools_parsed else "stop") if last else None,
            }
            if want_ids:
                choice["token_ids"] = [t.token_id for t in group]
            yield self._event(exchange, self._chunk(exchange, [choice]))
        if (body.get("stream_options") or {}).get("include_usage"):
            yield self._event(exchange, self._chunk(exchange, [], usage=self._usage(exchange)))
        yield self._event(exchange, "[DONE]")
        exchange.finished = True

    def _usage(self, exchange: Exchange) -> dict[str, int]:
        prompt, completion = len(exchange.prompt_token_ids), len(exchange.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _complete(self, exchange: Exchange, step: Step, body: dict[str, Any]) -> Response:
        message: dict[str, Any] = {"role": "assistant", "content": step.content or None}
        if step.reasoning:
            message["reasoning_content"] = step.reasoning
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json()},
                }
                for i, call in enumerate(step.tool_calls)
            ]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": _finish_reason(step)}
        if body.get("logprobs"):
            top_k = int(body.get("top_logprobs") or 0)
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {"content": [_logprob_entry(t, as_ids, top_k) for t in exchange.tokens]}
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{id(exchange):x}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(exchange),
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = [t.token_id for t in exchange.tokens]
            payload["prompt_token_ids"] = exchange.prompt_token_ids
        content = json.dumps(payload, ensure_ascii=False).encode()
        exchange.sent.extend(content)
        exchange.finished = True
        return Response(content, media_type="application/json")


def _probe_step(body: dict[str, Any]) -> Step:
    """The endpoint probe's answer: a call of the first tool offered, else a short text."""
    tools = body.get("tools") or []
    if tools and isinstance(tools[0], dict):
        name = str((tools[0].get("function") or {}).get("name", "tool"))
        return Step(tool_calls=[ToolCallStep(name=name, arguments={"word": "ok"})])
    return Step(content="ok")


class ScriptedModelServer:
    """Runs a `ScriptedModel` with uvicorn on a loopback port in a thread of its own."""

    def __init__(self, script: Script, *, host: str = "127.0.0.1", port: int = 0, **model_args: Any) -> None:
        self.model = ScriptedModel(script, **model_args)
        self._server = ThreadedServer(self.model.app, host=host, port=port, lifespan="off")

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    @property
    def exchanges(self) -> list[Exchange]:
        return self.model.exchanges

    def __enter__(self) -> ScriptedModelServer:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop()
