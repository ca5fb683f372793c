"""The capture proxy's HTTP shell: forward OpenCode's chat completions upstream, relay the bytes, record a turn.

The upstream's bytes reach the agent unchanged and as they arrive; each request's record is folded and written by
a background task after its body has ended, so capture never delays the agent. Every request leaves a record,
including failed, stalled and disconnected ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from opencode_env.proxy.capture import (
    Fold,
    RewriteConfig,
    compact_request,
    fold_response,
    fold_stream,
    neutral_error,
    recorded_headers,
    rewrite_request,
    tools_blob,
    turn_kind,
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

    def __repr__(self) -> str:
        return f"ProxySettings(upstream_url={self.upstream_url!r}, trace_path={self.trace_path!r})"


class TraceWriter:
    """Appends one JSON line per record and flushes it, so a killed agent still leaves every finished turn."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._tools_written: set[str] = set()
        self.turns_written = 0

    def write_tools(self, sha: str, tools: Any) -> None:
        if sha not in self._tools_written:
            self._tools_written.add(sha)
            self._write({"type": "tools", "sha256": sha, "tools": tools})

    def write_turn(self, record: dict[str, Any]) -> None:
        self._write({"type": "turn", **record})
        self.turns_written += 1

    def _write(self, line: dict[str, Any]) -> None:
        os.write(self._fd, json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")

    def close(self) -> None:
        os.close(self._fd)


class CaptureProxy:
    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.trace = TraceWriter(settings.trace_path)
        self._turns = itertools.count()
        self._history: list[tuple[int, list[str]]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.idle_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def aclose(self) -> None:
        await self.drain()
        await self._client.aclose()
        self.trace.close()

    async def drain(self) -> int:
        while self._pending:
            await asyncio.gather(*list(self._pending))
        return self.trace.turns_written

    def pending(self) -> int:
        return len(self._pending)

    def _schedule(self, finishing: Any) -> None:
        task = asyncio.ensure_future(finishing)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _upstream_headers(self, incoming: dict[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        headers.update({name: incoming[name] for name in FORWARDED_REQUEST_HEADERS if name in incoming})
        if self.settings.api_key:
            headers["authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    async def chat_completions(self, request: Request) -> Response:
        started, started_wall = time.monotonic(), time.time()
        turn = next(self._turns)
        incoming = {name.lower(): value for name, value in request.headers.items()}
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
        except ValueError as error:
            rejected = {"turn": turn, "timestamp": started_wall, "outcome": "bad_request", "upstream_error": str(error)}
            self._schedule(self._write(rejected))
            return JSONResponse({"error": {"message": str(error), "type": "invalid_request_error"}}, 400)
        sent = rewrite_request(body, self.settings.rewrite)
        compact, hashes = compact_request(sent, self._history)
        self._history.append((turn, hashes))
        blob = tools_blob(sent)
        record: dict[str, Any] = {
            "turn": turn,
            "timestamp": started_wall,
            "kind": turn_kind(body, incoming),
            "headers": recorded_headers(incoming),
            "request": compact,
            "stream": bool(sent.get("stream")),
            "tools": blob,
        }
        upstream_request = self._client.build_request(
            "POST",
            f"{self.settings.upstream_url}/chat/completions",
            content=json.dumps(sent, ensure_ascii=False).encode(),
            headers=self._upstream_headers(incoming),
        )
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.TimeoutException as error:
            return self._failed(record, started, "stalled", 504, f"upstream sent nothing in time: {error!r}")
        except httpx.HTTPError as error:
            return self._failed(record, started, "unreachable", 502, f"upstream unreachable: {error!r}")
        record["upstream_status"] = upstream.status_code
        if upstream.status_code != 200:
            return await self._upstream_error(record, started, upstream)
        if not record["stream"]:
            raw = await upstream.aread()
            await upstream.aclose()
            self._schedule(
                self._finish(
                    record=record,
                    started=started,
                    raw=raw,
                    arrivals=[(len(raw), time.monotonic())],
                    problem=None,
                    streamed=False,
                )
            )
            return Response(raw, media_type=upstream.headers.get("content-type", "application/json"))
        return StreamingResponse(
            self._relay(record, started, upstream),
            headers=_response_headers(upstream),
            media_type=upstream.headers.get("content-type", "text/event-stream"),
        )

    def _failed(self, record: dict[str, Any], started: float, outcome: str, status: int, error: str) -> Response:
        record.update(outcome=outcome, upstream_error=error, latency_s=round(time.monotonic() - started, 6))
        self._schedule(self._write(record))
        return JSONResponse({"error": {"message": error, "type": "upstream_error", "code": status}}, status)

    async def _upstream_error(self, record: dict[str, Any], started: float, upstream: httpx.Response) -> Response:
        raw = await upstream.aread()
        await upstream.aclose()
        status = upstream.status_code
        record.update(
            outcome="upstream_error",
            upstream_error=raw[:2000].decode("utf-8", errors="replace"),
            latency_s=round(time.monotonic() - started, 6),
        )
        self._schedule(self._write(record))
        if status == 429 or status >= 500:
            return Response(
                raw,
                status_code=status,
                headers=_response_headers(upstream),
                media_type=upstream.headers.get("content-type", "application/json"),
            )
        return JSONResponse(neutral_error(status, raw), 400)

    async def _relay(self, record: dict[str, Any], started: float, upstream: httpx.Response) -> AsyncIterator[bytes]:
        raw = bytearray()
        arrivals: list[tuple[int, float]] = []
        problem: tuple[str, str] | None = None
        client_gone = True
        try:
            async for piece in upstream.aiter_raw():
                raw += piece
                arrivals.append((len(raw), time.monotonic()))
                yield piece
            client_gone = False
        except httpx.ReadTimeout:
            problem, client_gone = ("stalled", f"no bytes from upstream for {self.settings.idle_timeout_s}s"), False
        except httpx.HTTPError as error:
            problem, client_gone = ("upstream_disconnected", f"upstream stream broke: {error!r}"), False
        finally:
            if client_gone:
                problem = ("client_disconnected", "the agent closed the connection mid-stream")
            self._schedule(
                self._finish(
                    record=record,
                    started=started,
                    raw=raw,
                    arrivals=arrivals,
                    problem=problem,
                    streamed=True,
                    upstream=upstream,
                )
            )

    async def _finish(
        self,
        *,
        record: dict[str, Any],
        started: float,
        raw: bytes | bytearray,
        arrivals: list[tuple[int, float]],
        problem: tuple[str, str] | None,
        streamed: bool,
        upstream: httpx.Response | None = None,
    ) -> None:
        if upstream is not None:
            await upstream.aclose()
        fold = fold_stream(raw) if streamed else fold_response(bytes(raw))
        outcome, error = problem or _outcome(fold, streamed)
        record.update(_fold_record(fold, started, arrivals), outcome=outcome)
        if error:
            record["upstream_error"] = error
        await self._write(record)

    async def _write(self, record: dict[str, Any]) -> None:
        blob = record.pop("tools", None)
        if blob:
            self.trace.write_tools(*blob)
        self.trace.write_turn(record)
        log.info(
            "turn %s %s %s %s tokens=%s",
            record["turn"],
            record.get("kind", "-"),
            record.get("upstream_status", "-"),
            record.get("outcome"),
            len(record.get("per_token_logps", [])),
        )


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
        "prompt_token_ids": fold.prompt_token_ids,
        "response": fold.message(),
        "usage": fold.usage,
        "token_id_source": fold.token_id_source(),
        "aligned": fold.aligned(),
        "latency_s": round(ended - started, 6),
        "ttft_s": None if ttft is None else round(ttft, 6),
    }


def _response_headers(upstream: httpx.Response) -> dict[str, str]:
    return {name: upstream.headers[name] for name in FORWARDED_RESPONSE_HEADERS if name in upstream.headers}


def create_app(settings: ProxySettings) -> FastAPI:
    proxy = CaptureProxy(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.aclose()

    app = FastAPI(
        title="opencode-env capture proxy", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.proxy = proxy

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "turns_written": proxy.trace.turns_written, "pending": proxy.pending()}

    @app.post("/drain")
    async def drain() -> dict[str, int]:
        return {"turns_written": await proxy.drain()}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.chat_completions(request)

    return app
