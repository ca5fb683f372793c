"""Who is at the other end of an agent's connection, asked of the kernel: only OpenCode's own uid may call the model.

The proxy's listening socket lives in the sandbox's network namespace. The server opens that namespace's TCP table
(`/proc/<pid>/net/tcp` of a process inside it) and hands the open file to the proxy, which reads it afresh for each
request: the socket whose local end is the request's client (address and port) and whose remote end is the proxy's
own (address and port) is the caller's (a tool that binds 127.0.0.2 with OpenCode's client port is another socket),
and its uid column (as the opener's user namespace sees it: a host uid) names who opened it. A token can leak
(OpenCode's own read tool can show it its environment); the owner of a socket cannot be forged from inside.
"""

from __future__ import annotations

import os
import socket
import sys

READ_CHUNK = 1 << 20
UID_COLUMN = 7


def _endpoint(address: bytes) -> tuple[str, int]:
    """`0100007F:1F90` -> ("127.0.0.1", 8080): the kernel prints each 32-bit word of the address in host order."""
    host, _, port = address.rpartition(b":")
    raw = bytes.fromhex(host.decode("ascii"))
    words = b"".join(int.from_bytes(raw[i : i + 4], "big").to_bytes(4, sys.byteorder) for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def _normal(endpoint: tuple[str, int]) -> tuple[str, int]:
    host = endpoint[0].removeprefix("::ffff:")
    return socket.inet_ntop(_family(host), socket.inet_pton(_family(host), host)), endpoint[1]


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def socket_owner(table: bytes, client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid that owns the client's end of the connection client -> server (both address and port of each end),
    in a /proc/net/tcp text; None when no socket, or sockets of more than one uid, have that connection."""
    wanted = (_normal(client), _normal(server))
    owners = set()
    for line in table.split(b"\n")[1:]:
        fields = line.split()
        if len(fields) <= UID_COLUMN:
            continue
        try:
            ends = (_normal(_endpoint(fields[1])), _normal(_endpoint(fields[2])))
        except ValueError:
            continue
        if ends == wanted:
            owners.add(int(fields[UID_COLUMN]))
    return owners.pop() if len(owners) == 1 else None


class PeerOwners:
    """The sandbox's TCP table, open for reading, and the uids allowed to call (OpenCode's; on a cloud VM root's
    too, whose own commands ask the proxy's health over TCP)."""

    def __init__(self, table_fd: int, allowed_uids: frozenset[int]) -> None:
        self._fd = table_fd
        self.allowed_uids = allowed_uids

    def _table(self) -> bytes:
        chunks, offset = [], 0
        while chunk := os.pread(self._fd, READ_CHUNK, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def allowed(self, client: tuple[str, int], server: tuple[str, int] | None) -> bool:
        if server is None:
            return False
        try:
            return socket_owner(self._table(), client, server) in self.allowed_uids
        except (OSError, ValueError):
            return False
