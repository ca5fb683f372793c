"""The chat-completions call: forward one of OpenCode's requests upstream, answer the agent, record the turn.

The upstream's bytes reach the agent unchanged and as they arrive (relay.py for a stream); each request's record
is folded, compacted and written by a background task after its body has ended, so capture never delays the agent.
Every request leaves a record, including failed, stalled and disconnected ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import json
import logging
import time
from collections.abc import Coroutine, Iterator
from typing import Any

from opencode_env.proxy.asgi import Receive, RequestTooLarge, Scope, Send, read_body, send_bytes, send_json
from opencode_env.proxy.breaker import Breaker
from opencode_env.proxy.capture import Fold, fold_response, fold_stream
from opencode_env.proxy.delivery import Client, Deliveries, Relayed
from opencode_env.proxy.fingerprint import PROBE_HEADER, fingerprint, tokenize_body
from opencode_env.proxy.json_values import loads
from opencode_env.proxy.records import Pending, TraceWriter, fold_outcome, fold_record
from opencode_env.proxy.relay import Arrivals, Problem, relay_stream
from opencode_env.proxy.request import clamped_fields, neutral_error, recorded_headers, rewrite_request, turn_kind
from opencode_env.proxy.settings import ProxySettings
from opencode_env.proxy.token_in import (
    CHAT_ROUTE,
    PROMPT_SOURCE,
    ROUTES,
    TokenIn,
    forwarding_refused,
    parse_routes,
    routed_body,
)
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


class CaptureProxy:
    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.breaker = Breaker(settings.max_unreachable, settings.max_server_errors)
        self.trace = TraceWriter(settings.trace_path, settings.trace_max_bytes)
        self._turns = itertools.count()
        self._pending: set[asyncio.Task[Any]] = set()
        self._answering: set[asyncio.Task[Any]] = set()
        self.deliveries = Deliveries(self._undelivered)
        origin = dataclasses.replace(Origin.parse(settings.upstream_url), connect_address=settings.upstream_address)
        self._pool = UpstreamPool(
            origin, connect_timeout_s=settings.connect_timeout_s, idle_timeout_s=settings.idle_timeout_s
        )
        self._token_in = (
            TokenIn(parse_routes(settings.token_in), unsupported=settings.token_in_unavailable or None)
            if settings.token_in
            else None
        )
        self._fingerprints: dict[int, asyncio.Task[str | None]] = {}
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
        self.trace.write_refused_total()
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
            body = loads(await read_body(receive, self.settings.max_request_bytes))
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
        if self.settings.template_check:
            self._fingerprints[turn] = asyncio.ensure_future(self._template_fingerprint(incoming))
        path, payload = CHAT_ROUTE, _request_bytes(sent)
        if self._token_in is not None:
            path, payload = await self._token_in_route(pending, sent, incoming)
        try:
            upstream = await self._pool.post(path, payload, self._upstream_headers(incoming))
            if pending.ticket is not None and pending.ticket.route is not None:
                upstream = await self._unless_refused(pending, upstream, incoming)
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
        version = (
            upstream.headers.get(self.settings.policy_version_header) if self.settings.policy_version_header else None
        )
        if version:
            pending.record["policy_version"] = version[:256]
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
            return CHAT_ROUTE, _request_bytes(sent)
        pending.ticket = ticket
        plan = await self._token_in.plan(ticket, sent, lambda body: self._tokenize(body, incoming))
        if plan.prompt_ids is None or plan.route is None:
            pending.record["token_in_fallback"] = plan.fallback
            return CHAT_ROUTE, _request_bytes(sent)
        pending.record["prompt_source"] = PROMPT_SOURCE[plan.route]
        path, body = routed_body(sent, plan.route, plan.prompt_ids)
        return path, _request_bytes(body)

    async def _unless_refused(
        self, pending: Pending, answer: UpstreamResponse, incoming: dict[str, str]
    ) -> UpstreamResponse:
        """A token-in route the server refused (404 it has none, 400/422 it rejects the ids): the turn goes again by
        the next route, or the chat route. A route is dropped for later turns at a 404, or when the turn then
        succeeded without it (a 400 the plain request also gets is not the ids' doing)."""
        assert self._token_in is not None
        assert pending.ticket is not None
        token_in, ticket = self._token_in, pending.ticket
        while ticket.route is not None and answer.status in (400, 404, 422):
            failed, status = ticket.route, answer.status
            excerpt = (await answer.read())[:300].decode("utf-8", errors="replace")
            reason = f"the server refused prompt ids by the {failed} route (HTTP {status}: {excerpt})"
            if status == 404:
                token_in.route_missing(reason, failed)
            later = [route for route in token_in.routes if ROUTES.index(route) > ROUTES.index(failed)]
            following = later[0] if later else None
            if following == "forwarded" and forwarding_refused(pending.sent) is not None:
                following = None
            ticket.route = following
            if following is None or ticket.sent_ids is None:
                ticket.route, ticket.sent_ids = None, None
                pending.record["prompt_source"] = "chat_template"
                pending.record["token_in_fallback"] = reason
                path, payload = CHAT_ROUTE, _request_bytes(pending.sent)
            else:
                pending.record["prompt_source"] = PROMPT_SOURCE[following]
                path, body = routed_body(pending.sent, following, ticket.sent_ids)
                payload = _request_bytes(body)
            answer = await self._pool.post(path, payload, self._upstream_headers(incoming))
            if answer.status == 200 and failed not in token_in.dropped:
                token_in.route_missing(reason, failed)
        return answer

    async def _tokenize(self, body: dict[str, Any], incoming: dict[str, str]) -> list[int] | str:
        """POST /tokenize at the server's root (vLLM): the ids the chat template gives, or why there are none."""
        assert self._token_in is not None
        try:
            answer = await self._server_root.post("/tokenize", _request_bytes(body), self._upstream_headers(incoming))
            raw = await answer.read()
        except UpstreamError as error:
            return f"/tokenize failed: {error}"
        if answer.status == 404:
            reason = f"the server has no {self._server_root.origin.base_path}/tokenize (404): no suffix can be rendered"
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

    async def _template_fingerprint(self, incoming: dict[str, str]) -> str | None:
        """The chat template's fingerprint at this call (the same body and hash as the host's endpoint probe)."""
        body = tokenize_body(self.settings.rewrite.model_override)
        try:
            headers = {**self._upstream_headers(incoming), PROBE_HEADER: "template"}
            answer = await self._server_root.post("/tokenize", _request_bytes(body), headers)
            raw = await answer.read()
            parsed = loads(raw) if answer.status == 200 else None
        except (UpstreamError, ValueError) as error:
            log.info("template fingerprint failed: %s", error)
            return None
        tokens = parsed.get("tokens") if isinstance(parsed, dict) else None
        if not isinstance(tokens, list) or not all(type(token) is int for token in tokens):
            return None
        return fingerprint(tokens)

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
        def record(raw: bytearray, arrivals: Arrivals, problem: Problem | None) -> asyncio.Task[str]:
            return self._schedule(self._fold_and_record(pending, raw, arrivals, problem, streamed=True))

        def relayed(size: int, recorded: asyncio.Task[str]) -> None:
            self.deliveries.relayed(client, Relayed(pending.turn, size, recorded))

        await relay_stream(receive, send, upstream, _response_headers(upstream), record=record, relayed=relayed)

    async def _fold_and_record(
        self,
        pending: Pending,
        raw: bytes | bytearray,
        arrivals: list[tuple[int, float]],
        problem: tuple[str, str] | None,
        *,
        streamed: bool,
    ) -> str:
        template = await self._template_of(pending.turn)
        with collector_paused():
            fold = fold_stream(raw) if streamed else fold_response(bytes(raw))
            outcome, error = problem or fold_outcome(fold, streamed)
            pending.record.update(fold_record(fold, pending.started, arrivals), outcome=outcome)
            if error:
                pending.record["upstream_error"] = error
            self._write(pending, fold, template)
            # Written: its token lists go now, so the collector resumes with nothing of this turn to walk.
            pending.record.clear()
            del fold
        return outcome

    async def _record(self, pending: Pending, fold: Fold | None) -> None:
        pending.record.setdefault("latency_s", round(time.monotonic() - pending.started, 6))
        self._write(pending, fold, await self._template_of(pending.turn))

    async def _template_of(self, turn: int) -> tuple[str | None] | None:
        """The turn's template fingerprint (template_check), None when none was asked for."""
        template = self._fingerprints.pop(turn, None)
        return None if template is None else (await template,)

    def _write(self, pending: Pending, fold: Fold | None, template: tuple[str | None] | None) -> None:
        if template is not None:
            pending.record["template_fingerprint"] = template[0]
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
        route = ticket.route
        if route == "tokens" and not fold.prompt_token_ids:
            fold.prompt_token_ids = list(ticket.sent_ids or [])
        elif route is not None and fold.prompt_token_ids != ticket.sent_ids:
            reason = (
                f"the engine did not echo the prompt ids sent by the {route} route (it rendered the messages itself: "
                "its own ids are kept, and the route is not used again)"
            )
            record["prompt_source"], record["token_in_fallback"] = "chat_template", reason
            self._token_in.route_missing(reason, route)
        if not fold.prompt_token_ids:
            self._token_in.forget(ticket)
            return
        self._token_in.settle(ticket, fold.prompt_token_ids, fold.ids(), fold.finish_reason)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a turn is folded and written. A fold makes ~6 containers per token that
    live until the record is written (no cycle among them); the collections they set off walked them again and
    again, ~6% of the proxy's CPU per streamed token in a burst (py-spy). Everything inside is synchronous, so no
    other task allocates meanwhile; the record is dropped before the collector resumes."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def server_root(base_path: str) -> str:
    """The server's root under an OpenAI-style base path ('/v1' -> ''), where vLLM serves /tokenize."""
    return base_path[: -len("/v1")] if base_path.endswith("/v1") else base_path


def _request_bytes(sent: dict[str, Any]) -> bytes:
    """The request as the upstream gets it. Escaping non-ASCII keeps to the C encoder's fast path (half the time on
    OpenCode's 31 KB requests), and a lone surrogate the agent sent is escaped instead of failing the encode."""
    return json.dumps(sent, separators=(",", ":")).encode()


def _response_headers(upstream: UpstreamResponse) -> dict[str, str]:
    return {name: upstream.headers[name] for name in FORWARDED_RESPONSE_HEADERS if name in upstream.headers}
