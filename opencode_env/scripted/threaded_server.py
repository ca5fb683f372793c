"""An ASGI app served by uvicorn on a loopback port, in a thread of its own (for tests, the demo and benches)."""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

import uvicorn


class ThreadedServer:
    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int = 0, lifespan: Literal["auto", "on", "off"] = "auto"
    ) -> None:
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="threaded-server", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.servers[0].sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.005)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
