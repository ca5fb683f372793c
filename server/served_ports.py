"""The ports this server is reached on, as each request's ASGI scope names its local address: a caller's `base_url`
may never name one of them (nor the configured `PORT`). A caller's own call arrives on one, so it is known before the
caller's URL is checked, whether the server was started with `--port`, by uvicorn or on a port the OS picked; other
listeners of the process (a model served in-process) are not the server's."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class ServedPorts:
    def __init__(self, configured: int) -> None:
        # Replaced, never changed in place: the caller-URL check reads it from a worker thread.
        self._ports = frozenset({configured})

    def __call__(self) -> frozenset[int]:
        return self._ports

    def note(self, scope: Scope) -> None:
        server = scope.get("server")
        if server and server[1] is not None and int(server[1]) not in self._ports:
            self._ports = self._ports | {int(server[1])}


class NoteServedPorts:
    """The middleware that notes each request's local port."""

    def __init__(self, app: ASGIApp, ports: ServedPorts) -> None:
        self.app = app
        self.ports = ports

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            self.ports.note(scope)
        await self.app(scope, receive, send)
