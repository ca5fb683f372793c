"""The capture proxy's HTTP shell: forward OpenCode's chat completions upstream, relay the bytes, record a turn.

The upstream's bytes reach the agent unchanged and as they arrive; each request's record is folded, compacted and
written by a background task after its body has ended, so capture never delays the agent. Every request leaves a
record, including failed, stalled and disconnected ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import json
import logging
import os
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from opencode_env.proxy.admin import Admin
from opencode_env.proxy.asgi import Receive, Scope, Send, send_bytes, send_json
from opencode_env.proxy.breaker import Breaker
from opencode_env.proxy.capture import (
    Fold,
    RewriteConfig,
    TraceCompactor,
    clamped_fields,
    fold_response,
    fold_stream,
    neutral_error,
    recorded_headers,
    rewrite_request,
    turn_kind,
)
from opencode_env.proxy.delivery import Client, Deliveries, Relayed
from opencode_env.proxy.json_values import loads
from opencode_env.proxy.peers import PeerOwners
from opencode_env.proxy.token_in import TOKENS_ROUTE, Ticket, TokenIn
from opencode_env.proxy.upstream import (
    Origin,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamStalled,
    UpstreamUnreachable,
)

log = logging.getLogger("opencode_env.proxy")
FORWARDED_REQUEST_HEADERS = ("x-session-id", "x-session-affinity", "user-agent")
FORWARDED_RESPONSE_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")


@dataclass(frozen=True)
class ProxySettings:
    upstream_url: str
    trace_path: str
    api_key: str = ""
    rewrite: RewriteConfig = field(default_factory=RewriteConfig)
    idle_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    access_token: str = ""
    max_unreachable: int = 3
    max_server_errors: int = 20
    upstream_address: str = ""
    """Connect to this address rather than resolving the upstream URL's host again (see Origin.connect_address)."""
    max_request_bytes: int = 32 * 2**20
    """A request body over this is answered 413 and recorded as the agent's doing, read no further."""
    peers: PeerOwners | None = None
    """Where set, a call from a socket any other uid owns is refused (403): only OpenCode itself calls the model."""
    token_in: bool = False
    """Send agent turns' prompts as token ids where the server takes them (see token_in.py)."""

    def __repr__(self) -> str:
        return f"ProxySettings(upstream_url={self.upstream_url!r}, trace_path={self.trace_path!r})"


@dataclass
class Pending:
    """A request on its way: what was sent, and what the record already knows."""

    turn: int
    started: float
    sent: dict[str, Any]
    record: dict[str, Any]
    ticket: Ticket | None = None


class TraceWriter:
    """Appends one JSON line per record and flushes it, so a killed agent still leaves every finished turn."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._compactor = TraceCompactor()
        self.turns_written = 0
        self.completion_tokens_written = 0

    def write_turn(self, pending: Pending, fold: Fold | None) -> None:
        record = pending.record
        prompt_ids = fold.prompt_token_ids if fold else []
        completion_ids = fold.ids() if fold else []
        request, prompt, blob = self._compactor.compact(pending.turn, pending.sent, prompt_ids, completion_ids)
        if blob is not None:
            self._write({"type": "tools", "sha256": blob[0], "tools": blob[1]})
        self._write({"type": "turn", **record, "request": request, **prompt})
        self.turns_written += 1
        self.completion_tokens_written += len(fold.tokens) if fold else 0

    def write_undelivered(self, relayed: Relayed) -> None:
        detail = f"the agent's connection closed before it had read the whole response ({relayed.size} bytes relayed)"
        self._write({"type": "delivery", "turn": relayed.turn, "outcome": "undelivered", "detail": detail})

    def _write(self, line: dict[str, Any]) -> None:
        try:
            encoded = json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:
            encoded = json.dumps(line, separators=(",", ":")).encode()
        os.write(self._fd, encoded + b"\n")

    def close(self) -> None:
        os.close(self._fd)


class CaptureProxy:
    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.breaker = Breaker(settings.max_unreachable, settings.max_server_errors)
        self.trace = TraceWriter(settings.trace_path)
        self._turns = itertools.count()
        self._pending: set[asyncio.Task[Any]] = set()
        self._answering: set[asyncio.Task[Any]] = set()
        self.deliveries = Deliveries(self._undelivered)
        origin = dataclasses.replace(Origin.parse(settings.upstream_url), connect_address=settings.upstream_address)
        self._pool = UpstreamPool(
            origin, connect_timeout_s=settings.connect_timeout_s, idle_timeout_s=settings.idle_timeout_s
        )
        self._token_in = TokenIn() if settings.token_in else None
        self._server_root = UpstreamPool(
            dataclasses.replace(origin, base_path=server_root(origin.base_path)),
            connect_timeout_s=settings.connect_timeout_s,
            idle_timeout_s=settings.idle_timeout_s,
            size=2,
        )

    async def aclose(self) -> None:
        await self.drain()
        await self._pool.aclose()
        await self._server_root.aclose()
        self.trace.close()

    async def drain(self) -> int:
        """Wait until every request being answered has ended and its record is written. A drain comes once the
        agent is gone, but the proxy may hear of its closed connection only after the drain request: a relay still
        running then is about to end and be recorded, and must not be cut off by the proxy's stop."""
        while self._pending or self._answering:
            await asyncio.wait(self._pending | self._answering)
        return self.trace.turns_written

    def pending(self) -> int:
        return len(self._pending)

    def _schedule(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    def _undelivered(self, relayed: Relayed) -> None:
        async def amend() -> None:
            if await relayed.recorded == "complete":
                self.trace.write_undelivered(relayed)
                log.info("turn %s undelivered: the agent closed its connection with bytes unread", relayed.turn)

        self._schedule(amend())

    def _upstream_headers(self, incoming: dict[str, str]) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream, application/json",
            "accept-encoding": "identity",
        }
        headers.update({name: incoming[name] for name in FORWARDED_REQUEST_HEADERS if name in incoming})
        if self.settings.api_key:
            headers["authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/chat/completions as a plain ASGI callable: no middleware between the upstream and the agent."""
        answering = asyncio.current_task()
        if answering is None:
            await self._answer(scope, receive, send)
            return
        self._answering.add(answering)
        try:
            await self._answer(scope, receive, send)
        finally:
            self._answering.discard(answering)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        started, started_wall = time.monotonic(), time.time()
        turn = next(self._turns)
        client: Client | None = tuple(scope["client"]) if scope.get("client") else None
        self.deliveries.request_started(client)
        incoming = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            body = loads(await _read_body(receive, self.settings.max_request_bytes))
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
        except ValueError as error:
            status = 413 if isinstance(error, RequestTooLarge) else 400
            rejected = Pending(
                turn,
                started,
                {},
                {"turn": turn, "timestamp": started_wall, "outcome": "bad_request", "upstream_error": str(error)},
            )
            self._schedule(self._record(rejected, None))
            await send_json(send, status, {"error": {"message": str(error), "type": "invalid_request_error"}})
            return
        sent = rewrite_request(body, self.settings.rewrite)
        clamped = clamped_fields(body)
        if clamped:
            log.warning("turn %s: sent upstream as one completion, overriding %.200r", turn, clamped)
        pending = Pending(
            turn,
            started,
            sent,
            {
                "turn": turn,
                "timestamp": started_wall,
                "kind": turn_kind(body, incoming),
                "headers": recorded_headers(incoming),
                "stream": bool(sent.get("stream")),
                "clamped": clamped,
            },
        )
        path, payload = "/chat/completions", _request_bytes(sent)
        if self._token_in is not None:
            path, payload = await self._token_in_route(pending, sent, incoming)
        try:
            upstream = await self._pool.post(path, payload, self._upstream_headers(incoming))
            if upstream.status == 404 and path == TOKENS_ROUTE:
                upstream = await self._without_tokens_route(pending, upstream, incoming)
        except UpstreamStalled as error:
            await self._failed(send, pending, "stalled", 504, str(error))
            return
        except UpstreamUnreachable as error:
            await self._failed(send, pending, "unreachable", 502, str(error))
            return
        except UpstreamDisconnected as error:
            await self._failed(send, pending, "upstream_disconnected", 502, str(error))
            return
        pending.record["upstream_status"] = upstream.status
        if upstream.status == 200:
            self.breaker.succeeded()
        if upstream.status != 200:
            await self._upstream_error(send, pending, upstream)
        elif pending.record["stream"]:
            await self._relay(receive, send, pending, upstream, client)
        else:
            await self._whole(send, pending, upstream)

    async def _token_in_route(
        self, pending: Pending, sent: dict[str, Any], incoming: dict[str, str]
    ) -> tuple[str, bytes]:
        """The route and body of a turn in token-in mode: its prompt as ids where it continues its session."""
        assert self._token_in is not None
        ticket = self._token_in.ticket(sent, incoming.get("x-session-id"), pending.record["kind"])
        if isinstance(ticket, str):
            pending.record["token_in_fallback"] = ticket
            return "/chat/completions", _request_bytes(sent)
        pending.ticket = ticket
        plan = await self._token_in.plan(ticket, sent, lambda body: self._tokenize(body, incoming))
        if plan.prompt_ids is None:
            pending.record["token_in_fallback"] = plan.fallback
            return "/chat/completions", _request_bytes(sent)
        pending.record["prompt_source"] = "token_in"
        return TOKENS_ROUTE, _request_bytes({**sent, "tokens": plan.prompt_ids})

    async def _without_tokens_route(
        self, pending: Pending, answer: UpstreamResponse, incoming: dict[str, str]
    ) -> UpstreamResponse:
        """The server has no token route: this turn and every later one take the chat route."""
        assert self._token_in is not None
        assert pending.ticket is not None
        await answer.read()
        reason = f"the server has no {self._pool.origin.base_path}{TOKENS_ROUTE} (404)"
        self._token_in.route_missing(reason)
        pending.ticket.sent_ids = None
        pending.record.pop("prompt_source", None)
        pending.record["token_in_fallback"] = reason
        return await self._pool.post(
            "/chat/completions", _request_bytes(pending.sent), self._upstream_headers(incoming)
        )

    async def _tokenize(self, body: dict[str, Any], incoming: dict[str, str]) -> list[int] | str:
        """POST /tokenize at the server's root (vLLM): the ids the chat template gives, or why there are none."""
        assert self._token_in is not None
        try:
            answer = await self._server_root.post("/tokenize", _request_bytes(body), self._upstream_headers(incoming))
            raw = await answer.read()
        except UpstreamError as error:
            return f"/tokenize failed: {error}"
        if answer.status == 404:
            reason = f"the server has no {self._server_root.origin.base_path}/tokenize (404)"
            self._token_in.route_missing(reason)
            return reason
        try:
            parsed = loads(raw) if answer.status == 200 else None
        except ValueError:
            parsed = None
        tokens = parsed.get("tokens") if isinstance(parsed, dict) else None
        if not isinstance(tokens, list) or not all(type(token) is int for token in tokens):
            return f"/tokenize answered {answer.status} without a list of token ids"
        return tokens

    async def _failed(self, send: Send, pending: Pending, outcome: str, status: int, error: str) -> None:
        stop = self.breaker.could_not_connect() if outcome == "unreachable" else None
        pending.record.update(outcome=outcome, upstream_error=f"{error}; {stop}" if stop else error)
        self._schedule(self._record(pending, None))
        if stop:
            await send_json(send, 400, {"error": {"message": stop, "type": "invalid_request_error"}})
            return
        await send_json(send, status, {"error": {"message": error, "type": "upstream_error", "code": status}})

    async def _upstream_error(self, send: Send, pending: Pending, upstream: UpstreamResponse) -> None:
        try:
            raw = await upstream.read()
        except UpstreamError as error:
            raw = str(error).encode()
        status = upstream.status
        stop = self.breaker.server_error() if status >= 500 else None
        recorded = raw[:2000].decode("utf-8", errors="replace")
        pending.record.update(outcome="upstream_error", upstream_error=f"{recorded}; {stop}" if stop else recorded)
        self._schedule(self._record(pending, None))
        if stop:
            await send_json(send, 400, {"error": {"message": stop, "type": "invalid_request_error"}})
        elif status == 429 or status >= 500:
            content_type = upstream.headers.get("content-type", "application/json")
            await send_bytes(send, status, raw, content_type, _response_headers(upstream))
        else:
            await send_json(send, 400, neutral_error(status, raw))

    async def _whole(self, send: Send, pending: Pending, upstream: UpstreamResponse) -> None:
        try:
            raw = await upstream.read()
        except UpstreamError as error:
            await self._failed(send, pending, "upstream_disconnected", 502, str(error))
            return
        self._schedule(self._fold_and_record(pending, raw, [(len(raw), time.monotonic())], None, streamed=False))
        await send_bytes(send, 200, raw, upstream.headers.get("content-type", "application/json"), {})

    async def _relay(
        self, receive: Receive, send: Send, pending: Pending, upstream: UpstreamResponse, client: Client | None
    ) -> None:
        raw = bytearray()
        arrivals: list[tuple[int, float]] = []
        problem: tuple[str, str] | None = None
        relay = asyncio.current_task()
        disconnected = asyncio.Event()

        async def watch_for_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()
            if relay is not None:
                relay.cancel()

        headers = [(b"content-type", upstream.headers.get("content-type", "text/event-stream").encode())]
        headers += [(name.encode(), value.encode()) for name, value in _response_headers(upstream).items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        watcher = asyncio.ensure_future(watch_for_disconnect())
        try:
            async for piece in upstream.iter_body():
                raw += piece
                arrivals.append((len(raw), time.monotonic()))
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except UpstreamStalled as error:
            problem = ("stalled", str(error))
        except UpstreamError as error:
            problem = ("upstream_disconnected", str(error))
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise
            if relay is not None:
                relay.uncancel()
            problem = ("client_disconnected", "the agent closed the connection mid-stream")
        finally:
            watcher.cancel()
            recorded = self._schedule(self._fold_and_record(pending, raw, arrivals, problem, streamed=True))
        if not disconnected.is_set():
            self.deliveries.relayed(client, Relayed(pending.turn, len(raw), recorded))
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _fold_and_record(
        self,
        pending: Pending,
        raw: bytes | bytearray,
        arrivals: list[tuple[int, float]],
        problem: tuple[str, str] | None,
        *,
        streamed: bool,
    ) -> str:
        fold = fold_stream(raw) if streamed else fold_response(bytes(raw))
        outcome, error = problem or _outcome(fold, streamed)
        pending.record.update(_fold_record(fold, pending.started, arrivals), outcome=outcome)
        if error:
            pending.record["upstream_error"] = error
        await self._record(pending, fold)
        return outcome

    async def _record(self, pending: Pending, fold: Fold | None) -> None:
        pending.record.setdefault("latency_s", round(time.monotonic() - pending.started, 6))
        if pending.ticket is not None:
            self._settle(pending, fold)
        self.trace.write_turn(pending, fold)
        record = pending.record
        log.info(
            "turn %s %s %s %s tokens=%s",
            record["turn"],
            record.get("kind", "-"),
            record.get("upstream_status", "-"),
            record.get("outcome"),
            len(record.get("per_token_logps", [])),
        )

    def _settle(self, pending: Pending, fold: Fold | None) -> None:
        """Token-in mode: the session's state after this turn (the engine's prompt ids are the truth)."""
        assert self._token_in is not None
        assert pending.ticket is not None
        ticket, record = pending.ticket, pending.record
        if fold is None or record.get("outcome") != "complete" or not fold.aligned():
            self._token_in.forget(ticket)
            return
        if ticket.sent_ids is not None and not fold.prompt_token_ids:
            fold.prompt_token_ids = ticket.sent_ids
        elif ticket.sent_ids is not None and fold.prompt_token_ids != ticket.sent_ids:
            record["token_in_fallback"] = "the engine reported other prompt ids than the ones sent (its own are kept)"
        if not fold.prompt_token_ids:
            self._token_in.forget(ticket)
            return
        self._token_in.settle(ticket, fold.prompt_token_ids, fold.ids(), fold.finish_reason)


def server_root(base_path: str) -> str:
    """The server's root under an OpenAI-style base path ('/v1' -> ''), where vLLM serves /tokenize."""
    return base_path[: -len("/v1")] if base_path.endswith("/v1") else base_path


def _outcome(fold: Fold, streamed: bool) -> tuple[str, str | None]:
    if fold.error:
        return "upstream_error", fold.error
    if streamed and not fold.done:
        return "upstream_disconnected", "the upstream stream ended without [DONE]"
    return "complete", None


def _fold_record(fold: Fold, started: float, arrivals: list[tuple[int, float]]) -> dict[str, Any]:
    ended = arrivals[-1][1] if arrivals else time.monotonic()
    ttft = None
    if fold.first_token_offset is not None:
        ttft = next((at for size, at in arrivals if size >= fold.first_token_offset), ended) - started
    return {
        "finish_reason": fold.finish_reason,
        "completion_tokens": fold.tokens,
        "completion_token_ids": fold.ids(),
        "per_token_logps": fold.logprobs,
        "top_logprobs": fold.top_logprobs,
        "response": fold.message(),
        "usage": fold.usage,
        "token_id_source": fold.token_id_source(),
        "aligned": fold.aligned(),
        "latency_s": round(ended - started, 6),
        "ttft_s": None if ttft is None else round(ttft, 6),
    }


def _request_bytes(sent: dict[str, Any]) -> bytes:
    """The request as the upstream gets it. Escaping non-ASCII keeps to the C encoder's fast path (half the time on
    OpenCode's 31 KB requests), and a lone surrogate the agent sent is escaped instead of failing the encode."""
    return json.dumps(sent, separators=(",", ":")).encode()


def _response_headers(upstream: UpstreamResponse) -> dict[str, str]:
    return {name: upstream.headers[name] for name in FORWARDED_RESPONSE_HEADERS if name in upstream.headers}


class RequestTooLarge(ValueError):
    """The agent sent a request body over the proxy's limit (its doing: recorded as a bad request)."""


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ValueError("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"the request body is over the proxy's limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


class ProxyApp:
    """The ASGI app: chat completions go straight to the proxy; everything else (health, drain, lifespan) to Admin."""

    def __init__(self, proxy: CaptureProxy) -> None:
        self.proxy = proxy
        self.admin = Admin(
            {("GET", "/healthz"): self._health, ("POST", "/drain"): self._drain},
            on_shutdown=proxy.aclose,
        )
        token = proxy.settings.access_token
        self._expected = f"bearer {token}".encode("latin-1") if token else b""

    async def _health(self) -> dict[str, Any]:
        trace = self.proxy.trace
        return {
            "ok": True,
            "turns_written": trace.turns_written,
            "completion_tokens_written": trace.completion_tokens_written,
            "pending": self.proxy.pending(),
        }

    async def _drain(self) -> dict[str, Any]:
        return {"turns_written": await self.proxy.drain()}

    def _authorized(self, scope: Scope) -> bool:
        """With an access token set, only the rollout's own agent (and the server) may call: anything else is 401."""
        if not self._expected:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credential = value.partition(b" ")
                return hmac.compare_digest(scheme.lower() + b" " + credential.strip(), self._expected)
        return False

    def _from_opencode(self, scope: Scope) -> bool:
        """Every TCP caller is checked; the admin's unix socket (no client address) is the server's alone."""
        peers, client = self.proxy.settings.peers, scope.get("client")
        if peers is None or client is None or peers.allowed(client, scope.get("server")):
            return True
        log.warning(
            "refused a call from %s: its socket is not OpenCode's (uid %d)", scope.get("client"), peers.allowed_uid
        )
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            await send_json(send, 401, {"error": {"message": "unauthorized", "type": "invalid_request_error"}})
            return
        if scope["type"] == "http" and not self._from_opencode(scope):
            message = "only OpenCode itself may call the model"
            await send_json(send, 403, {"error": {"message": message, "type": "invalid_request_error"}})
            return
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions" and scope["method"] == "POST":
            await self.proxy(scope, receive, send)
        else:
            await self.admin(scope, receive, send)


def create_app(settings: ProxySettings) -> ProxyApp:
    return ProxyApp(CaptureProxy(settings))
