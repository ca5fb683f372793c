"""The host's part of the test grader's by-value mode: the files it hands over and the code under test's server.

By value, pytest (as the grader) never imports the work dir: its modules are stand-ins (by_value_client.py) that
forward each call as plain data (by_value_wire.py) over a socket in the verifier directory to a server
(by_value_server.py) that the host starts at the same time, under an identity of its own that owns no file
(SERVER_UID), with the work dir last on its path. While they run, the work dir is sealed to the tests' identity.
Everything of the code under test runs in the server: an `__eq__`, an import hook, a patch of pytest or of
builtins, `os._exit`, an endless loop. The tests see what it returns, rebuilt from plain types, or what it raised,
as its builtin type; anything else fails the test. The three files are written as the package they are in the
source tree, under a directory of root's that no task identity can write.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from opencode_env import inside
from opencode_env.sandbox.base import VERIFIER_DIR

ROOT = f"{VERIFIER_DIR}/.opencode-env-by-value"
"""The package root the runner and the server import from (handed files: root's, read-only)."""
SOCKET = f"{VERIFIER_DIR}/.opencode-env-by-value.sock"
"""Made by the tests' process (the grader writes the verifier directory; the agent's identity cannot)."""
BROKEN = f"{SOCKET}.broken"
"""The tests' process's word on the channel to the code: `intact`, or `broken: WHY` (by_value_client.BROKEN_SUFFIX)."""
MAX_BROKEN_READ = 4096
MODULES = ("by_value_wire", "by_value_client", "by_value_server")
INSIDE = Path(inside.__file__).parent
"""Where the three come from: the code that runs in the sandbox (opencode_env/inside/)."""
SERVER_UID = 60999
"""The code under test's identity by value: neither the agent's (`user` owns its HOME and `logs/`, the verifier
directory's parent, so it could rename the directory the tests are read from) nor the grader's; it owns nothing."""
SEALED = re.compile(r"([0-9]+:[0-9]+) ([0-7]{3,4})", re.ASCII)
ROOT_STEP_S = 60.0
GRACE_S = 5.0
"""How long the server may take to exit once pytest has (it exits when the connection closes); then it is killed."""


def handed_files() -> dict[str, str]:
    files = {f"{ROOT}/opencode_env/__init__.py": "", f"{ROOT}/opencode_env/inside/__init__.py": ""}
    for name in MODULES:
        files[f"{ROOT}/opencode_env/inside/{name}.py"] = (INSIDE / f"{name}.py").read_text(encoding="utf-8")
    return files


def runner_options(call_timeout_s: float, *, socket: str = SOCKET, root: str = ROOT) -> list[str]:
    """The pytest runner's options that make the work dir's modules stand-ins."""
    return ["--by-value", socket, "--by-value-root", root, "--call-timeout", f"{call_timeout_s:g}"]


def server_argv(
    workdir: str,
    wait_s: float,
    *,
    socket: str = SOCKET,
    root: str = ROOT,
    python: str = "python3",
    uid: int = SERVER_UID,
) -> list[str]:
    """The code under test's server in the image's Python, isolated like the runner, its package from `root`: started
    as the sandbox's root, it drops to `uid` (no supplementary groups, HOME nowhere) before it imports anything else,
    so no code of the work dir ever runs as anyone who owns a file (uid < 0: stay who started it, for tests)."""
    drop = f"os.setgroups([]); os.setgid({uid}); os.setuid({uid}); " if uid >= 0 else ""
    bootstrap = (
        f"import os, runpy, sys; {drop}os.environ['HOME'] = '/nonexistent'; sys.path.insert(0, {root!r}); "
        "runpy.run_module('opencode_env.inside.by_value_server', run_name='__main__')"
    )
    return [python, "-I", "-c", bootstrap, "--socket", socket, "--workdir", workdir, "--wait", f"{wait_s:g}"]


def server_command(workdir: str, wait_s: float) -> str:
    """Run as the sandbox's root (server_argv drops to SERVER_UID)."""
    return f"cd {shlex.quote(workdir)} && exec {shlex.join(server_argv(workdir, wait_s))}"


def seal_command(workdir: str) -> str:
    """As root: the work dir's owner and mode printed (`UID:GID MODE`), then the directory root's, in SERVER_UID's
    group, 0750: the server reads the code, and the tests' identity cannot reach a byte under it by any route (an
    import, a path it adds, `runpy`, a subprocess), so the code can only run in the server."""
    quoted = shlex.quote(workdir)
    return f"stat -c '%u:%g %a' {quoted} && chown 0:{SERVER_UID} {quoted} && chmod 0750 {quoted}"


def unseal_command(workdir: str, sealed_stdout: str) -> str | None:
    """As root: the work dir's owner and mode back as seal_command printed them (None when it printed no such)."""
    found = SEALED.fullmatch(sealed_stdout.strip())
    if found is None:
        return None
    owner, mode = found.groups()
    quoted = shlex.quote(workdir)
    return f"chown {owner} {quoted} && chmod {mode} {quoted}"


def clear_paths() -> list[str]:
    return [ROOT, SOCKET, BROKEN]


def broken_reason(marker: bytes | None) -> str | None:
    """Why the channel broke, from the tests' process's marker (None: it never broke, or the runner never listened,
    which the report's absence grades). Total over any bytes."""
    if marker is None or not marker.startswith(b"broken: "):
        return None
    return marker[len(b"broken: ") : 300].decode("utf-8", "replace").strip() or "the channel broke"
