"""Whether the agent read a streamed response to its end.

The proxy's last `send` of a response returns once the bytes are in a socket buffer, not once the agent has read
them: an agent killed right after (our deadline) leaves a turn that was relayed whole yet never seen. The kernel
tells the two apart when the agent's socket closes: with every byte read it sends a FIN, with bytes still unread
it answers with a reset. `Deliveries` remembers, per agent connection, the streamed turn it last received whole;
a reset on that connection before its next request marks that turn undelivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Client = tuple[str, int]
UNREAD_ENDINGS = (ConnectionResetError, BrokenPipeError)


@dataclass(frozen=True)
class Relayed:
    turn: int
    size: int
    recorded: asyncio.Future[str]
    """Resolves to the outcome the turn's own record was written with."""


class Deliveries:
    def __init__(self, undelivered: Callable[[Relayed], None]) -> None:
        self._undelivered = undelivered
        self._last: dict[Client, Relayed] = {}

    def request_started(self, client: Client | None) -> None:
        """A new request on a connection: the agent read the previous response (HTTP/1.1 has no pipelining here)."""
        if client is not None:
            self._last.pop(client, None)

    def relayed(self, client: Client | None, relayed: Relayed) -> None:
        if client is not None:
            self._last[client] = relayed

    def connection_closed(self, client: Client | None, error: BaseException | None) -> None:
        last = self._last.pop(client, None) if client is not None else None
        if last is not None and isinstance(error, UNREAD_ENDINGS):
            self._undelivered(last)


def delivery_aware_protocol(deliveries: Deliveries) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, telling `deliveries` how each connection ended (uvicorn keeps that from the app)."""
    base: type[Any]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class DeliveryAwareProtocol(base):  # type: ignore[misc]
        def connection_lost(self, exc: Exception | None) -> None:
            client = self.client
            deliveries.connection_closed(tuple(client) if client else None, exc)
            super().connection_lost(exc)

    return DeliveryAwareProtocol
