"""The host's bash inside an image's task root.

The image's own libc may be another glibc, musl, or none at all, so a host program cannot simply be run there: the
host's bash, its loader and libraries are mounted read-only at HOST_MOUNT in the task's root, and the task's commands
start that bash through the host's own dynamic loader (`ld.so --library-path DIRS PROGRAM`). What it starts runs with
the image's own loader and libraries. Nothing of ours runs there: our launchers and OpenCode run in the sandbox's own
root, from the host's files (bubblewrap.py). Without an image the task's commands run on the host's own system, and
bash runs as itself.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from opencode_env.sandbox.base import SandboxError

HOST_MOUNT = "/run/opencode-env/host"
LDD_TIMEOUT_S = 30.0
_LIBRARY = re.compile(r"=>\s+(/\S+)")
_LOADER = re.compile(r"^\s*(/\S*ld-linux\S*|/\S*ld-musl\S*|/\S*ld\.so\S*)\s+\(")


@dataclass(frozen=True)
class HostRuntime:
    """How a sandbox command starts a host program: as itself, or through the host's loader under `prefix`."""

    prefix: str = ""
    loader: str = ""
    library_path: str = ""
    view: tuple[str, ...] = ()
    """The host paths shown under `prefix` (read-only), and nothing else of the host: the loader, the library
    directories, the programs and what they read (the interpreter's standard library, userns.py, trust files)."""

    def program(self, program: str) -> list[str]:
        """argv that starts a host program (a path, or a name looked up on the host)."""
        if not self.prefix:
            return [program]
        path = program if "/" in program else host_program(program)
        return [self.inside(self.loader), "--library-path", self.library_path, self.inside(path)]

    def inside(self, host_path: str) -> str:
        """Where a host path is seen from inside the sandbox (links resolved on the host first: an absolute link
        would otherwise be followed in the image)."""
        if not self.prefix:
            return host_path
        return self.prefix + os.path.realpath(host_path)


HOST_ROOT = HostRuntime()


@functools.cache
def image_runtime(programs: tuple[str, ...], shown: tuple[str, ...] = ()) -> HostRuntime:
    """The loader and library directories the host's `programs` need, read once from ldd; the host view is those,
    the programs and `shown`."""
    loaders: set[str] = set()
    directories: list[str] = []
    for program in programs:
        listed = subprocess.run(
            ["ldd", os.path.realpath(program)], capture_output=True, text=True, timeout=LDD_TIMEOUT_S, check=False
        )
        if listed.returncode != 0:
            raise SandboxError(f"cannot list the libraries of {program}: {listed.stderr.strip()[-300:]}")
        for line in listed.stdout.splitlines():
            if interpreter := _LOADER.match(line):
                loaders.add(os.path.realpath(interpreter.group(1)))
            elif library := _LIBRARY.search(line):
                directory = os.path.dirname(os.path.realpath(library.group(1)))
                if directory not in directories:
                    directories.append(directory)
    if len(loaders) != 1:
        raise SandboxError(f"the host's programs name {len(loaders)} dynamic loaders ({sorted(loaders)}), not one")
    loader = loaders.pop()
    prefixed = [HOST_MOUNT + directory for directory in directories]
    view = {loader, *directories, *(os.path.realpath(path) for path in (*programs, *shown) if os.path.exists(path))}
    return HostRuntime(prefix=HOST_MOUNT, loader=loader, library_path=":".join(prefixed), view=outermost(view))


def outermost(paths: set[str]) -> tuple[str, ...]:
    """The paths, without those inside another of them (a bind inside a bind would be redundant)."""
    ordered = sorted(paths)
    kept: list[str] = []
    for path in ordered:
        if not any(path == top or path.startswith(top.rstrip("/") + "/") for top in kept):
            kept.append(path)
    return tuple(kept)


BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the host's programs are looked up, and a sandbox command's PATH unless its image sets one."""


def host_program(name: str) -> str:
    found = shutil.which(name, path=BASE_PATH)
    if found is None:
        raise SandboxError(f"{name} is not installed on this machine; the local backend needs it")
    return found
