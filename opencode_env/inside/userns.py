"""Run a command in a new user namespace that maps several in-sandbox uids at once, as root of that namespace.

unshare(1) maps one uid unless newuidmap is installed (and configured for root in /etc/subuid); a privileged parent
may write a map of several lines itself. Run as the host's root inside a sandbox's other namespaces:

    python3 -I -S userns.py --map 0:2000131072:1 --map 1000:2000132072:1 --gid 1000 -- unshare --pid ... -- cmd

The child enters a new user namespace, the parent (still root in the parent namespace) writes its uid and gid
maps, the child becomes the namespace's uid 0 (the first mapped host uid) with group `--gid`, and execs the command
with every capability of that namespace and none outside it, and no way to gain privileges (no_new_privs). The
exit status of the command is passed on.

Only the standard library: the file runs by path, with no site packages, before the command it starts.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
CHILD_SETUP_FAILED = 125


def _ranges(specs: list[str]) -> list[tuple[int, int, int]]:
    ranges = []
    for spec in specs:
        inside, outside, *count = spec.split(":")
        ranges.append((int(inside), int(outside), int(count[0]) if count else 1))
    return ranges


def _map_text(ranges: list[tuple[int, int, int]]) -> str:
    return "".join(f"{inside} {outside} {count}\n" for inside, outside, count in sorted(ranges))


def _child(ready: int, go: int, gid: int, argv: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.unshare(CLONE_NEWUSER) != 0:
        os.write(2, f"userns: unshare failed: {os.strerror(ctypes.get_errno())}\n".encode())
        os._exit(CHILD_SETUP_FAILED)
    os.write(ready, b"u")
    os.close(ready)
    if os.read(go, 1) != b"g":
        os._exit(CHILD_SETUP_FAILED)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(0, 0, 0)
    os.execvp(argv[0], argv)


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="userns")
    parser.add_argument("--map", action="append", required=True, help="INSIDE:OUTSIDE[:COUNT] uids (and gids)")
    parser.add_argument("--gid", type=int, required=True, help="the group the command runs with (mapped)")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    ranges = _ranges(options.map)
    if not argv or not any(inside == 0 for inside, _, _ in ranges):
        parser.error("a command and a map for uid 0 are required")
    child_ready, parent_ready = os.pipe()
    parent_go, child_go = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(child_ready)
        os.close(child_go)
        try:
            _child(parent_ready, parent_go, options.gid, argv)
        finally:
            os._exit(CHILD_SETUP_FAILED)
    os.close(parent_ready)
    os.close(parent_go)
    if os.read(child_ready, 1) == b"u":
        text = _map_text(ranges)
        with open(f"/proc/{pid}/uid_map", "w") as uid_map:
            uid_map.write(text)
        with open(f"/proc/{pid}/gid_map", "w") as gid_map:
            gid_map.write(text)
        os.write(child_go, b"g")
    os.close(child_go)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
