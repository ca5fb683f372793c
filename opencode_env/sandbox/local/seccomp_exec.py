"""Load a syscall filter (a BPF program in a file, from syscall_filter.py) and exec a command under it.

    python3 -I -S seccomp_exec.py FILTER.bpf -- cmd args...

Only the standard library: the file runs by path, with no site packages, as the last step before a sandbox
command. no_new_privs is set first (the kernel requires it of an unprivileged process); the filter then holds for
the command and everything it starts, and cannot be removed.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SOCK_FILTER_BYTES = 8
FAILED = 125


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _fail(message: str) -> SystemExit:
    os.write(2, f"seccomp_exec: {message}\n".encode())
    return SystemExit(FAILED)


def load_filter(args: list[str]) -> list[str]:
    """Load the filter `args` name and return the command to exec under it (a failure exits 125, nothing run)."""
    if len(args) < 3 or args[1] != "--":
        raise _fail("usage: seccomp_exec.py FILTER.bpf -- cmd args...")
    with open(args[0], "rb") as source:
        program = source.read()
    if not program or len(program) % SOCK_FILTER_BYTES:
        raise _fail(f"{args[0]} is not a BPF program")
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // SOCK_FILTER_BYTES, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise _fail(f"loading the filter: {os.strerror(ctypes.get_errno())}")
    return args[2:]


if __name__ == "__main__":
    command = load_filter(sys.argv[1:])
    os.execvp(command[0], command)
