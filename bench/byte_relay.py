"""The least a relay between the agent and the model can do: copy bytes both ways, and nothing else.

    python -m bench.byte_relay --upstream 127.0.0.1:PORT --port-file FILE

No HTTP, no capture: each accepted connection gets its own upstream connection and every read is written on at
once, on the same event loop the proxy runs (uvloop where installed). bench/proxy_overhead runs it beside the proxy,
so the CPU a relay cannot avoid on this machine (a wakeup, a read and a write per token that arrives alone) is
measured apart from what the proxy's HTTP handling and capture add.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import cast


class Half(asyncio.Protocol):
    """One direction's reader: writes what it receives to the other side's transport."""

    def __init__(self) -> None:
        self.peer: asyncio.Transport | None = None
        self.pending = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connect(self, peer: asyncio.Transport) -> None:
        self.peer = peer
        if self.pending:
            peer.write(bytes(self.pending))
            self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.pending += data
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


class Accepted(Half):
    """The agent's side: connects to the model as it is accepted and forwards what arrived meanwhile."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self._upstream = upstream
        self._joining: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._joining = asyncio.get_running_loop().create_task(self._join())

    async def _join(self) -> None:
        loop = asyncio.get_running_loop()
        upstream_transport, upstream = await loop.create_connection(Half, *self._upstream)
        if self.transport is not None:
            upstream.connect(self.transport)
        self.connect(cast(asyncio.Transport, upstream_transport))


def publish(port: int, port_file: str) -> None:
    temporary = f"{port_file}.tmp"
    with open(temporary, "w") as handle:
        handle.write(str(port))
    os.replace(temporary, port_file)


async def serve(upstream: tuple[str, int], port_file: str) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: Accepted(upstream), "127.0.0.1", 0)
    publish(server.sockets[0].getsockname()[1], port_file)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True, help="host:port of the model")
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve((host, int(port)), args.port_file))


if __name__ == "__main__":
    main()
