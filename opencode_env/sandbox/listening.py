"""The TCP ports this process listens on, read from the kernel rather than from configuration: a server started
with `--port`, by `uvicorn server.app:app`, or on a port the OS picked is still known by its real ports, and so is
every listener it runs beside (egress proxies, relays)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

LISTEN_STATE = "0A"
READING_MAX_AGE_S = 5.0
"""A reading costs ~9 ms here (every fd of the process, the whole TCP table), more with every connection; a server's
ports do not change once it listens, so checks within a few seconds share one."""
TCP_TABLES = (Path("/proc/self/net/tcp"), Path("/proc/self/net/tcp6"))
FD_DIR = Path("/proc/self/fd")


def listening_ports_in(tables: Iterable[str], inodes: frozenset[int]) -> frozenset[int]:
    """The local ports of the LISTEN sockets in /proc's tcp tables whose inode is one of `inodes`."""
    ports = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE or not fields[9].isdigit():
                continue
            if int(fields[9]) in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return frozenset(ports)


def socket_inodes(fd_dir: Path = FD_DIR) -> frozenset[int]:
    """The inodes of the sockets this process holds open (`socket:[N]` links under /proc/self/fd)."""
    inodes = set()
    for entry in os.scandir(fd_dir):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue  # closed between the listing and the read
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[8:-1]))
    return frozenset(inodes)


def listening_ports() -> frozenset[int]:
    """The TCP ports this process listens on (empty where /proc is not Linux's)."""
    try:
        tables = [table.read_text() for table in TCP_TABLES if table.exists()]
        return listening_ports_in(tables, socket_inodes())
    except FileNotFoundError:
        return frozenset()


class ListeningPorts:
    """`listening_ports()`, read again only once the last reading is older than `max_age_s`."""

    def __init__(self, max_age_s: float = READING_MAX_AGE_S) -> None:
        self._max_age_s = max_age_s
        self._read_at = float("-inf")
        self._ports: frozenset[int] = frozenset()

    def __call__(self) -> frozenset[int]:
        now = time.monotonic()
        if now - self._read_at > self._max_age_s:
            self._ports, self._read_at = listening_ports(), now
        return self._ports
