"""The agent's tools' shell on a cloud VM, where OpenCode runs as a uid of its own and holds no privilege: a broker
that root starts, and the client that OpenCode starts as its SHELL.

OpenCode cannot become the task's `user` itself (that takes a capability, and any code OpenCode loads would hold
it), so its tools' shell asks: the client hands its stdin, stdout and stderr (SCM_RIGHTS), its argv, cwd and
environment to the broker over a unix socket only OpenCode's uid can reach; the broker checks the peer's uid
(SO_PEERCRED), and starts `bash` with those descriptors as `user`, in a session of its own, with the task's
environment instead of OpenCode's (its OPENCODE_* names and its HOME never reach a tool). The exit status goes back
to the client, which exits with it; a client that goes away (OpenCode stopping a tool past its timeout) takes the
tool's process group with it.

Uploaded and run as a file (`python3 -I -S tool_broker.py ...`): it imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import struct
import subprocess
import sys
import threading

HEADER = struct.Struct("!Q")
STATUS = struct.Struct("!i")
MAX_REQUEST_BYTES = 64 * 2**20
DROPPED_PREFIXES = ("OPENCODE_", "XDG_")
"""OpenCode's own names (its config, its key, its switches) and the dirs of its private home."""


def _exact(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def tool_environment(client_env: dict[str, str], task_env: dict[str, str], home: str, user: str) -> dict[str, str]:
    """What a tool command starts with: OpenCode's environment without its own names, the task's user's identity,
    then the task's environment over it."""
    kept = {name: value for name, value in client_env.items() if not name.startswith(DROPPED_PREFIXES)}
    return {**kept, "HOME": home, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash", **task_env}


class Broker:
    def __init__(self, *, allowed_uid: int, uid: int, gid: int, home: str, user: str, task_env: dict[str, str]):
        self.allowed_uid, self.uid, self.gid = allowed_uid, uid, gid
        self.home, self.user, self.task_env = home, user, task_env

    def serve(self, path: str) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        os.chown(path, self.allowed_uid, -1)
        os.chmod(path, 0o600)
        server.listen(64)
        while True:
            conn, _ = server.accept()
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, peer_uid, _ = struct.unpack("3i", creds)
            if peer_uid != self.allowed_uid:
                print(f"refused a tool request from uid {peer_uid}", file=sys.stderr, flush=True)
                return
            header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            try:
                if len(fds) != 3 or len(header) != HEADER.size:
                    return
                (size,) = HEADER.unpack(header)
                if size > MAX_REQUEST_BYTES:
                    return
                request = json.loads(_exact(conn, size))
                process = self._start(request, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            threading.Thread(target=self._stop_when_client_leaves, args=(conn, process), daemon=True).start()
            code = process.wait()
            conn.sendall(STATUS.pack(code if code >= 0 else 128 - code))

    def _start(self, request: object, fds: list[int]) -> subprocess.Popen[bytes]:
        fields = request if isinstance(request, dict) else {}
        argv = [str(word) for word in fields.get("argv") or []]
        client_env = {str(name): str(value) for name, value in dict(fields.get("env") or {}).items()}
        env = tool_environment(client_env, self.task_env, self.home, self.user)
        cwd = str(fields.get("cwd") or self.home)
        try:
            return self._popen(argv, env, fds, cwd)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return self._popen(argv, env, fds, self.home)

    def _popen(self, argv: list[str], env: dict[str, str], fds: list[int], cwd: str) -> subprocess.Popen[bytes]:
        """`bash` as the task's user, in a session of its own (so the whole tool can be stopped), umask 002: what
        the tools write, OpenCode (in the user's group) can edit, as the user can edit what OpenCode writes."""
        return subprocess.Popen(
            ["bash", *argv],
            cwd=cwd,
            stdin=fds[0],
            stdout=fds[1],
            stderr=fds[2],
            env=env,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            start_new_session=True,
            umask=0o002,
        )

    @staticmethod
    def _stop_when_client_leaves(conn: socket.socket, process: subprocess.Popen[bytes]) -> None:
        """A client that goes away (closed, reset, or the connection closed here once the tool ended) ends the
        tool's process group if it still runs."""
        with contextlib.suppress(OSError):
            while conn.recv(1):
                continue
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def client(path: str, argv: list[str]) -> int:
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    payload = json.dumps({"argv": argv, "cwd": cwd, "env": dict(os.environ)}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(path)
            socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
            conn.sendall(payload)
            (code,) = STATUS.unpack(_exact(conn, STATUS.size))
        except OSError as error:
            print(f"the agent's tools' shell was refused: {error}", file=sys.stderr)
            return 126
        return int(code)


def serve(path: str, config_path: str) -> None:
    """`config_path` (root's): the uid allowed to ask, the task's user by name, and the task's environment."""
    with open(config_path, encoding="utf-8") as config_file:
        config = json.load(config_file)
    user = pwd.getpwnam(str(config["user"]))
    Broker(
        allowed_uid=int(config["allowed_uid"]),
        uid=user.pw_uid,
        gid=user.pw_gid,
        home=str(config["home"]),
        user=user.pw_name,
        task_env={str(name): str(value) for name, value in config["task_env"].items()},
    ).serve(path)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "client":
        return client(argv[1], argv[2:])
    if len(argv) == 3 and argv[0] == "serve":
        serve(argv[1], argv[2])
        return 0
    print("usage: tool_broker.py client SOCKET [ARG...] | serve SOCKET CONFIG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
