"""A synchronous view of an async client: its coroutines run on an event loop in a thread of the view's own, so it
works from plain scripts and from inside a running loop (a notebook) alike."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="opencode-env-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class SyncView:
    """Every async method of the wrapped client, called synchronously: `view.run_rollout(...)` and so on."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._loop: LoopThread | None = None

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner().run(attribute(*args, **kwargs))

        return call

    def _runner(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop

    def __enter__(self) -> SyncView:
        self._runner().run(self._client.connect())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run(self._client.close())
            self._loop.stop()
            self._loop = None
