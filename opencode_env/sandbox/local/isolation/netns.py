"""Sockets that listen inside a rollout's network namespace but are served from the host.

A rollout's network namespace has loopback only. The services its processes may reach (the capture proxy, the
model in black_box mode, the egress proxy) listen on 127.0.0.1 *inside* that namespace through a socket created
there by the server and served by a process outside it: nothing in the sandbox can reach the host, another rollout
or a private address, and no relay process runs where the sandbox could touch it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000


def listen_in(holder_pid: int, port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:port inside the network namespace of `holder_pid`.

    setns() moves only the calling thread, so the socket is made on a fresh thread that ends right after.
    """
    made: list[socket.socket] = []
    failures: list[BaseException] = []

    def make() -> None:
        try:
            namespace = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(namespace, CLONE_NEWNET) != 0:
                    error = ctypes.get_errno()
                    raise OSError(error, f"setns into the sandbox's network: {os.strerror(error)}")
            finally:
                os.close(namespace)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
            made.append(listener)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=make, name="netns-listen")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return made[0]
