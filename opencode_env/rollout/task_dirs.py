"""A directory of the work dir that holds the task's handed files (`verify_files`) is the task's alone when verify
runs: whatever the agent left in it (a test module pytest would collect beside the handed tests, an `__init__.py`
that changes how pytest imports them) is removed before the handed files are written, each a finding. So is an
`__init__.py` at the top of the work dir above them (pytest's default import mode walks package markers up from a
test file to choose what goes on sys.path). What the task itself wrote there (`files`) stays.

Root does the removing, before the hand-over and with none of the agent's processes alive, stepping into each
directory only when it is a real one (never through a link the agent left).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opencode_env.rollout.grading import integrity
from opencode_env.sandbox.base import Sandbox, sealed_dirs, task_path
from opencode_env.wire.grading import FindingKind, IntegrityFinding

MAX_FINDINGS = 1000
"""Findings recorded per rollout for what was removed (the rest is removed all the same, and counted)."""
PACKAGE_MARKER = "__init__.py"


@dataclass(frozen=True)
class TaskDirs:
    keep: Mapping[str, frozenset[str]]
    """Each directory (relative to the work dir) that holds handed files: the names in it that stay."""
    markers: tuple[str, ...]
    """Package markers above the handed files (relative to the work dir) that are removed."""


def plan(handed: Iterable[str], task_files: Iterable[str], workdir: str) -> TaskDirs:
    """Which directories are the task's (pure): every one between the work dir and a handed file in it."""
    top = posixpath.normpath(workdir)
    keep: dict[str, set[str]] = {}
    inside = False
    for path in handed:
        target = posixpath.normpath(task_path(path, workdir))
        if not target.startswith(top.rstrip("/") + "/"):
            continue
        inside = True
        for directory in sealed_dirs(target, workdir):
            keep.setdefault(posixpath.relpath(directory, top), set())
        relative = posixpath.relpath(target, top)
        parent = posixpath.dirname(relative)
        while parent:
            keep[parent].add(posixpath.basename(relative))
            relative, parent = parent, posixpath.dirname(parent)
    ours = {posixpath.relpath(posixpath.normpath(task_path(path, workdir)), top) for path in [*handed, *task_files]}
    for path in ours:
        directory = posixpath.dirname(path)
        if directory in keep:
            keep[directory].add(posixpath.basename(path))
    markers = (PACKAGE_MARKER,) if inside and PACKAGE_MARKER not in ours else ()
    return TaskDirs({directory: frozenset(names) for directory, names in keep.items()}, markers)


def clear_command(directory: str, keep: frozenset[str]) -> str:
    """Into `directory` one real directory at a time (none is a link), every entry not in `keep` printed (NUL
    after each) and removed; nothing when a component is missing or not a real directory (the hand-over replaces
    it whole)."""
    steps = " && ".join(f"[ -d {q} ] && [ ! -L {q} ] && cd -- {q}" for q in map(shlex.quote, directory.split("/")))
    spared = " ".join(f"! -name {shlex.quote(_literal(name))}" for name in sorted(keep))
    return f"{{ {steps} || exit 0; }}; find . -mindepth 1 -maxdepth 1 {spared} -print0 -exec rm -rf -- {{}} +"


def marker_command(markers: Iterable[str]) -> str:
    quoted = [shlex.quote(marker) for marker in markers]
    return "; ".join(f"if [ -e {q} ] || [ -L {q} ]; then printf '%s\\0' {q}; rm -rf -- {q}; fi" for q in quoted)


def _kind(path: str) -> FindingKind:
    """A grader file's own kind (a conftest.py, bytecode, a shadow of pytest), else what any other entry is here."""
    kind = integrity.finding_kind(path)
    if kind == "shadow_module" and posixpath.basename(path).split(".")[0] not in integrity.SHADOW_NAMES:
        return "task_directory"
    return kind


def _literal(name: str) -> str:
    """`name` as a find -name pattern matching only itself."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in name)


async def clear(
    sandbox: Sandbox, handed: Mapping[str, str], task_files: Iterable[str], *, workdir: str, timeout_s: float
) -> list[IntegrityFinding] | str:
    """The agent's entries in the task's directories removed: their findings, or why it failed (a string)."""
    planned = plan(handed, task_files, workdir)
    commands = [(directory, clear_command(directory, names)) for directory, names in sorted(planned.keep.items())]
    if planned.markers:
        commands.append(("", marker_command(planned.markers)))
    removed: list[str] = []
    for directory, command in commands:
        ran = await sandbox.run(command, timeout_s=timeout_s, identity="root", cwd=workdir)
        if ran.exit_code != 0:
            return f"clearing {directory or 'the work dir'!r} of the agent's entries: {ran.stderr[-300:]}"
        names = ran.stdout.split("\0")[:-1]
        removed += [posixpath.normpath(posixpath.join(directory, name)) for name in names]
    findings = [
        IntegrityFinding(path=path, kind=_kind(path), act="created", response="removed")
        for path in removed[:MAX_FINDINGS]
    ]
    if len(removed) > MAX_FINDINGS:
        more = f"... and {len(removed) - MAX_FINDINGS} more"
        findings.append(IntegrityFinding(path=more, kind="task_directory", act="created", response="removed"))
    return findings
