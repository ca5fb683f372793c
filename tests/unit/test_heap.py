"""The server's malloc arena limit: eight threads that each allocate get at most two arenas between them once the
server has set it (glibc's default gives them one each), counted by glibc's own malloc_info."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

COUNT_ARENAS = """
import ctypes, sys, tempfile, threading, time
if sys.argv[1] == "limited":
    from server import heap
    assert heap.limit_arenas()
ready, done = threading.Barrier(9), threading.Event()
def allocate():
    kept = [bytearray(200) for _ in range(20_000)]
    ready.wait()
    done.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
ready.wait()
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
with tempfile.TemporaryFile("w+") as report:
    stream = ctypes.c_void_p(libc.fdopen(report.fileno(), b"w"))
    libc.malloc_info(0, stream)
    libc.fflush(stream)
    report.seek(0)
    print(report.read().count("<heap nr="))
done.set()
"""


def arenas(mode: str) -> int:
    completed = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode], capture_output=True, text=True, check=True, timeout=120
    )
    return int(completed.stdout)


def test_the_server_keeps_threads_to_two_malloc_arenas() -> None:
    if not hasattr(ctypes.CDLL(None), "malloc_info"):
        pytest.skip("not glibc: no per-thread arenas to limit")
    assert arenas("default") > 2
    assert arenas("limited") <= 2
