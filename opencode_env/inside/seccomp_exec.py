"""The last step of every local sandbox command: enter the task's root, become the command's identity, drop
capabilities, load the syscall filters and exec the command with its own environment (`enter` takes them in that
order; a failure exits 125 with nothing run).

    python3 -I -S seccomp_exec.py [--env-fd N | --env-file PATH] [--root DIR] [--uid N --gid N] [--drop-cap N]
        [--drop-caps] FILTER.bpf [FILTER.bpf ...] -- cmd args...

Standard library only: it runs by path from the host's files, and reads our environment and filters before
anything of the task's."""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
SOCK_FILTER_BYTES = 8
LINUX_CAPABILITY_VERSION_3 = 0x20080522
FAILED = 125


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _fail(message: str) -> SystemExit:
    os.write(2, f"seccomp_exec: {message}\n".encode())
    return SystemExit(FAILED)


class Plan:
    """What the command line asks for."""

    def __init__(self, args: list[str]) -> None:
        self.env_fd: int | None = None
        self.env_file: str | None = None
        self.root: str | None = None
        self.uid: int | None = None
        self.gid: int | None = None
        self.drop_caps = False
        self.drop_cap: list[int] = []
        self.filters: list[str] = []
        self.command: list[str] = []
        options = {"--env-fd", "--env-file", "--root", "--uid", "--gid", "--drop-cap"}
        index = 0
        while index < len(args):
            word = args[index]
            if word == "--":
                self.command = args[index + 1 :]
                break
            if word == "--drop-caps":
                self.drop_caps = True
            elif word in options:
                if index + 1 >= len(args):
                    raise _fail(f"{word} needs a value")
                self._option(word, args[index + 1])
                index += 1
            else:
                self.filters.append(word)
            index += 1
        if not self.filters or not self.command:
            raise _fail("usage: seccomp_exec.py [options] FILTER.bpf [...] -- cmd args...")

    def _option(self, name: str, value: str) -> None:
        if name == "--env-fd":
            self.env_fd = int(value)
        elif name == "--env-file":
            self.env_file = value
        elif name == "--root":
            self.root = value
        elif name == "--uid":
            self.uid = int(value)
        elif name == "--drop-cap":
            self.drop_cap.append(int(value))
        else:
            self.gid = int(value)


def parse_environment(raw: bytes) -> dict[bytes, bytes]:
    """NUL-separated NAME=VALUE entries (a value may hold newlines, never a NUL)."""
    env: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if name and equals:
            env[name] = value
    return env


def _read_environment(plan: Plan) -> dict[bytes, bytes]:
    if plan.env_fd is not None:
        chunks: list[bytes] = []
        offset = 0
        while chunk := os.pread(plan.env_fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        os.close(plan.env_fd)
        return parse_environment(b"".join(chunks))
    if plan.env_file is not None:
        with open(plan.env_file, "rb") as source:
            return parse_environment(source.read())
    return {}


def _read_filters(paths: list[str]) -> list[ctypes.Array[ctypes.c_char]]:
    programs = []
    for path in paths:
        with open(path, "rb") as source:
            program = source.read()
        if not program or len(program) % SOCK_FILTER_BYTES:
            raise _fail(f"{path} is not a BPF program")
        programs.append(ctypes.create_string_buffer(program, len(program)))
    return programs


def _load_filters(libc: ctypes.CDLL, programs: list[ctypes.Array[ctypes.c_char]]) -> None:
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    for buffer in programs:
        fprog = _SockFprog(len(buffer) // SOCK_FILTER_BYTES, ctypes.addressof(buffer))
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            raise _fail(f"loading the filter: {os.strerror(ctypes.get_errno())}")


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise _fail(f"clearing ambient capabilities: {os.strerror(ctypes.get_errno())}")
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise _fail(f"dropping capabilities: {os.strerror(ctypes.get_errno())}")


def _drop_capability(libc: ctypes.CDLL, number: int) -> None:
    """One capability out of the bounding, effective, permitted and inheritable sets (a root keeps the rest)."""
    if libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) != 0:
        raise _fail(f"dropping capability {number} from the bounding set: {os.strerror(ctypes.get_errno())}")
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise _fail(f"reading capabilities: {os.strerror(ctypes.get_errno())}")
    word, bit = divmod(number, 32)
    mask = ~(1 << bit) & 0xFFFFFFFF
    data[word].effective &= mask
    data[word].permitted &= mask
    data[word].inheritable &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise _fail(f"dropping capability {number}: {os.strerror(ctypes.get_errno())}")


def enter(args: list[str]) -> tuple[list[str], dict[bytes, bytes]]:
    """Do every step the arguments ask for; returns the command and the environment to exec it with."""
    plan = Plan(args)
    libc = ctypes.CDLL(None, use_errno=True)
    env = _read_environment(plan)
    filters = _read_filters(plan.filters)
    if plan.root is not None:
        cwd = os.getcwd()
        os.chroot(plan.root)
        try:
            os.chdir(cwd)
        except OSError as error:
            raise _fail(f"the working directory {cwd} is not in the task's root: {error.strerror}") from error
    if plan.gid is not None:
        os.setgroups([])
        os.setresgid(plan.gid, plan.gid, plan.gid)
    if plan.uid is not None:
        os.setresuid(plan.uid, plan.uid, plan.uid)
    for number in plan.drop_cap:
        _drop_capability(libc, number)
    if plan.drop_caps:
        _drop_capabilities(libc)
    _load_filters(libc, filters)
    return plan.command, env


if __name__ == "__main__":
    command, environment = enter(sys.argv[1:])
    try:
        os.execvpe(command[0], command, environment)
    except OSError as error:
        raise _fail(f"{command[0]}: {error.strerror}") from error
