"""A server that is told to stop answers its callers first.

On SIGTERM/SIGINT the rollouts in flight are cancelled and each caller gets its partial result (status `cancelled`)
before uvicorn starts closing connections (it closes WebSockets at once); then the MCP sessions' event streams end
(uvicorn would wait for them) and the signal goes on to uvicorn. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from opencode_env.server.disconnect import PendingReplies
from opencode_env.server.rollouts import Rollouts

log = logging.getLogger("opencode_env.server")
SHUTDOWN_GRACE_S = 30.0
REPLY_GRACE_S = 10.0
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def answer_before_exit(
    rollouts: Rollouts, replies: PendingReplies, streams_closing: asyncio.Event
) -> Callable[[], None]:
    """Install the handlers (in the main thread only: a server run in a thread by tests has no signals); returns
    the function that puts the previous ones back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in SHUTDOWN_SIGNALS}
    draining: list[asyncio.Task[None]] = []

    def pass_on(sig: int, frame: FrameType | None) -> None:
        handler = previous[signal.Signals(sig)]
        if callable(handler):
            handler(sig, frame)

    async def drain_then_exit(sig: int, frame: FrameType | None) -> None:
        await rollouts.shut_down(SHUTDOWN_GRACE_S)
        # The answers just produced must be sent before uvicorn closes the WebSockets (HTTP answers it waits for).
        await replies.settled(REPLY_GRACE_S)
        streams_closing.set()
        pass_on(sig, frame)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        if rollouts.shutting_down:
            pass_on(sig, frame)
            return
        log.info("signal %d: cancelling %d rollout(s), answering their callers, then exiting", sig, rollouts.in_flight)
        loop.call_soon_threadsafe(lambda: draining.append(asyncio.ensure_future(drain_then_exit(sig, frame))))

    for sig in SHUTDOWN_SIGNALS:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
