"""Relay a streamed answer to the agent as its bytes arrive, noting when each read came and how the stream ended.

The upstream's bytes reach the agent unchanged. The agent's disconnect is watched for while relaying: it cancels the
relay, which then ends as the agent's doing, not as an error. The record is scheduled in the relay's `finally`, so
a stall, a broken upstream or a disconnect still leaves one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from opencode_env.proxy.asgi import Receive, Send
from opencode_env.proxy.upstream import UpstreamError, UpstreamResponse, UpstreamStalled

Arrivals = list[tuple[int, float]]
"""(bytes relayed so far, time.monotonic() of the read that brought them), one per read."""
Problem = tuple[str, str]
"""(outcome, error) of a stream that did not end as the upstream meant it to."""


async def relay_stream(
    receive: Receive,
    send: Send,
    upstream: UpstreamResponse,
    headers: dict[str, str],
    *,
    record: Callable[[bytearray, Arrivals, Problem | None], asyncio.Task[str]],
    relayed: Callable[[int, asyncio.Task[str]], None],
) -> None:
    """Send `upstream`'s body on with `headers`; `record` schedules the turn's record once the body has ended, and
    `relayed` hears of a response the agent got whole (its size and that record) before its last message."""
    raw = bytearray()
    arrivals: Arrivals = []
    problem: Problem | None = None
    relay = asyncio.current_task()
    disconnected = asyncio.Event()

    async def watch_for_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected.set()
        if relay is not None:
            relay.cancel()

    raw_headers = [(b"content-type", upstream.headers.get("content-type", "text/event-stream").encode())]
    raw_headers += [(name.encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
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
        recorded = record(raw, arrivals, problem)
    if not disconnected.is_set():
        relayed(len(raw), recorded)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
