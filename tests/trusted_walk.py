"""The trusted-root boundary, checked from inside a live local sandbox: every path a trusted process of ours
executes, loads or reads as configuration, and every directory above each, probed as each identity a task or the
model can run as, by trying what would replace it (rename, create, open for writing, chmod). Also the attack that
found the gap: a task command plants its own userns.py where the checkout's is, and the host's root must never run it.

Run as a program (`python tests/trusted_walk.py PACKAGE_PARENT BASE_DIR MODE`) with the package imported from
PACKAGE_PARENT, so a test can put the checkout under /tmp, /home/user or elsewhere; it prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

IDENTITIES = ("user", "root", "grader", "agent")

PROBE = r"""
import json, os, stat, sys, time
STARTED = time.monotonic()
FOUND, SEEN, CAP = [], set(), 400000
def probe(path):
    try:
        st = os.lstat(path)
    except OSError:
        return
    if path != "/":
        moved = path + ".probe-moved"
        try:
            os.rename(path, moved)
        except OSError:
            pass
        else:
            os.rename(moved, path)
            FOUND.append([path, "renamed"])
    if stat.S_ISLNK(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        try:
            fd = os.open(os.path.join(path, ".probe-new"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            pass
        else:
            os.close(fd)
            os.unlink(os.path.join(path, ".probe-new"))
            FOUND.append([path, "created an entry"])
    elif stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            os.close(fd)
            FOUND.append([path, "opened for writing"])
    try:
        os.chmod(path, stat.S_IMODE(st.st_mode))
    except OSError:
        pass
    else:
        FOUND.append([path, "chmod (owns it)"])
def visit(path):
    if path in SEEN or len(SEEN) > CAP:
        return
    SEEN.add(path)
    probe(path)
PATHS = json.loads(sys.argv[1])
for top in PATHS["probe"] + PATHS["walk"]:
    parts = top.rstrip("/").split("/")
    for depth in range(1, len(parts)):
        visit("/".join(parts[:depth]) or "/")
    if not os.path.lexists(top):
        if os.access(os.path.dirname(top), os.X_OK):
            FOUND.append([top, "missing"])
        continue
    visit(top)
    if top in PATHS["walk"] and os.path.isdir(top) and not os.path.islink(top):
        for directory, dirs, files in os.walk(top):
            for name in dirs + files:
                visit(os.path.join(directory, name))
print(json.dumps({"found": FOUND, "probed": len(SEEN), "capped": len(SEEN) > CAP, "s": time.monotonic() - STARTED}))
"""


def trusted_paths(sandbox: object) -> dict[str, list[str]]:
    """Every path of the sandbox's root a trusted process of ours starts, loads or reads as configuration, taken
    from the argv and environments the backend builds (not listed by hand): each identity's command chain, the
    tools' shell and what it starts, OpenCode's binary, PATH, config and trust settings, the interpreter's
    standard library, and the host paths shown for lookups by absolute path. "walk": trees probed entry by entry
    (the runtime paths where our programs start from, the control directory); "probe": the rest, each with the
    directories above it (a system directory or a second view of a runtime path is one read-only mount)."""
    from opencode_env.sandbox.local.isolation import bubblewrap
    from opencode_env.sandbox.local.isolation.command_argv import TOOL_SHELL, Roles, command_argv
    from opencode_env.sandbox.local.isolation.host_runtime import BASE_PATH
    from opencode_env.sandbox.local.isolation.host_view import HELPERS, sandbox_runtime_paths

    compartment = sandbox.compartment  # type: ignore[attr-defined]
    processes = sandbox._processes  # type: ignore[attr-defined]
    words: set[str] = set()
    for identity in IDENTITIES:
        for grader_is_root in (False, True):
            argv = command_argv(
                1,
                compartment.ids,
                "true",
                "/",
                own_pid_namespace=True,
                identity=identity,  # type: ignore[arg-type]
                helpers=HELPERS,
                env_fd=3,
                roles=Roles(grader_is_root=grader_is_root),
            )
            words.update(argv)
    shell = compartment.layout.control / os.path.relpath(TOOL_SHELL, bubblewrap.CONTROL_MOUNT)
    words.update(shlex.split(shell.read_text().splitlines()[-1]))
    opencode_env = processes._opencode_environment({})
    for name, value in opencode_env.items():
        if name == "PATH":
            words.update(value.split(":"))
        elif value.startswith("/") and not value.startswith(bubblewrap.AGENT_HOME):
            words.add(value)
    paths = {word for word in words if word.startswith("/") and "=" not in word}
    for word in words:
        if word and "/" not in word and (found := shutil.which(word, path=BASE_PATH)):
            paths.add(found)
    runtime = sandbox_runtime_paths(compartment.host_tools, compartment.extra_path)
    walked = {bubblewrap.CONTROL_MOUNT, *(bubblewrap.runtime_inside(path) for path in runtime)}
    paths.update(path for path in runtime if not path.startswith(bubblewrap.SYSTEM_DIRS))
    paths.update({"/etc/passwd", "/etc/group", "/bin/sh", bubblewrap.AGENT_CONFIG_DIR})
    if compartment.tools.opencode:
        paths.add(compartment.tools.opencode)
    return {"walk": sorted(walked), "probe": sorted(paths - walked)}


async def walk(sandbox: object, paths: dict[str, list[str]], minimum: int = 1000) -> dict[str, list[list[str]]]:
    """What each identity could change among `paths` (and the directories above them); empty lists when none.
    `minimum`: how many paths the probe must have reached (a walk that saw nothing proves nothing)."""
    script = f"python3 -I -S -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(paths))}"

    async def probe(identity: str, held: bool) -> list[list[str]]:
        ran = await sandbox.run(  # type: ignore[attr-defined]
            script, timeout_s=600, identity=identity, cwd="/", keep_background=held
        )
        assert ran.exit_code == 0, (identity, ran.stderr[-2000:])
        report = json.loads(ran.stdout.strip().splitlines()[-1])
        assert report["probed"] >= minimum, report
        assert not report["capped"], report
        return [item for item in report["found"] if not _own_place(identity, item)]

    cases = {identity: (identity, False) for identity in IDENTITIES}
    cases["root, in the holder's namespaces"] = ("root", True)
    reports = await asyncio.gather(*(probe(*case) for case in cases.values()))
    return dict(zip(cases, reports, strict=True))


def _own_place(identity: str, found: list[str]) -> bool:
    """What an identity may change: OpenCode's own home (its config dir among it) is OpenCode's, the agent identity
    itself; the places the sandbox gives the task (/tmp, /home/user, ...) take new entries, and their owners may
    chmod them, while what of ours lies below them is a mount point no identity can move (its own probe)."""
    from opencode_env.sandbox.local.isolation.bubblewrap import AGENT_HOME, TASK_WRITABLE

    path, change = found
    if path in TASK_WRITABLE and change in ("created an entry", "chmod (owns it)"):
        return True
    return identity == "agent" and (path == AGENT_HOME or path.startswith(AGENT_HOME + "/"))


ATTACK = """
set -e
target={target}
top=$(printf '%s' "$target" | cut -d/ -f1-3)
mv "$top" "$top.gone" 2>/dev/null || true
mkdir -p "$(dirname "$target")"
printf '%s\\n' 'import os' 'open("/home/user/host-root-canary", "w").write(str(os.getuid()))' > "$target"
chmod -R a+rX "$top"
echo planted
"""


async def attack(sandbox: object, identity: str) -> dict[str, object]:
    """The issue's attack: as `identity`, move away the top directory of the checkout's userns.py (if the sandbox
    shows it) and plant one that leaves a canary; then commands of every identity run. The canary would be written
    by the host's root."""
    from opencode_env.inside import userns

    target = shlex.quote(str(Path(userns.__file__).resolve()))
    planted = await sandbox.run(  # type: ignore[attr-defined]
        ATTACK.format(target=target), timeout_s=60, identity=identity, cwd="/", keep_background=identity == "root"
    )
    ran = {}
    for who in IDENTITIES:
        done = await sandbox.run("echo ok", timeout_s=60, identity=who, cwd="/")  # type: ignore[attr-defined]
        ran[who] = done.stdout.strip() if done.exit_code == 0 else done.stderr[-500:]
    canary = sandbox.compartment.layout.home / "host-root-canary"  # type: ignore[attr-defined]
    return {
        "planted": planted.stdout.strip(),
        "ran": ran,
        "canary": canary.exists(),
        "canary_owner": canary.stat().st_uid if canary.exists() else None,
    }


async def main(base_dir: str, mode: str) -> None:
    from opencode_env.sandbox.base import SandboxSpec
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.tools import cached_tools

    runtime = Path(sys.argv[1]) / "runtime" / "bin"
    extra_path = (str(runtime),) if runtime.is_dir() else ()
    backend = LocalBackend(cached_tools, base_dir=Path(base_dir), extra_path=extra_path)
    sandbox = await backend.create(SandboxSpec(image="host"))
    try:
        if mode == "walk":
            report: dict[str, object] = {"found": await walk(sandbox, trusted_paths(sandbox))}
            shown = await sandbox.run("hello; stat -c %a /tmp", timeout_s=60, cwd="/")
            report["runtime_on_path"] = shown.stdout.split()
        else:
            report = await attack(sandbox, mode)
        report["package"] = str(Path(sys.modules["opencode_env"].__file__ or "").parent)
        print(json.dumps(report))
    finally:
        await sandbox.close()


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    import opencode_env

    assert (opencode_env.__file__ or "").startswith(sys.argv[1]), opencode_env.__file__
    asyncio.run(main(sys.argv[2], sys.argv[3]))
