"""Who is at the other end of an agent's connection, asked of the kernel: only OpenCode's own uid may call the model.

The proxy's listening socket lives in the sandbox's network namespace. The server opens that namespace's TCP table
(`/proc/<pid>/net/tcp` of a process inside it) and hands the open file to the proxy, which reads it afresh for each
request: the socket whose local port is the request's client port and whose remote port is the proxy's own is the
caller's, and its uid column (as the opener's user namespace sees it: a host uid) names who opened it. A token can
leak (OpenCode's own read tool can show it its environment); the owner of a socket cannot be forged from inside.
"""

from __future__ import annotations

import os

READ_CHUNK = 1 << 20
UID_COLUMN = 7


def _port(address: bytes) -> int:
    """`0100007F:1F90` -> 8080."""
    return int(address.rpartition(b":")[2], 16)


def socket_owner(table: bytes, client_port: int, server_port: int) -> int | None:
    """The uid that owns the client's end of the connection client_port -> server_port, in a /proc/net/tcp text."""
    for line in table.split(b"\n")[1:]:
        fields = line.split()
        if len(fields) <= UID_COLUMN:
            continue
        if _port(fields[1]) == client_port and _port(fields[2]) == server_port:
            return int(fields[UID_COLUMN])
    return None


class PeerOwners:
    """The sandbox's TCP table, open for reading, and the one uid allowed to call."""

    def __init__(self, table_fd: int, allowed_uid: int) -> None:
        self._fd = table_fd
        self.allowed_uid = allowed_uid

    def _table(self) -> bytes:
        chunks, offset = [], 0
        while chunk := os.pread(self._fd, READ_CHUNK, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def allowed(self, client: tuple[str, int], server: tuple[str, int] | None) -> bool:
        if server is None:
            return False
        return socket_owner(self._table(), client[1], server[1]) == self.allowed_uid
