"""The work dir is data, not the grader's configuration: the files that steer a grader (test configs, conftest.py,
bytecode, `.pth`, package metadata, packages named like a grader's imports, `.git` config and hooks) are
snapshotted before the agent runs, compared and put back before verify; each difference is an `IntegrityFinding`.
Listings travel as NUL-separated base64 records and a tar, so no name is lost or mistaken."""

from __future__ import annotations

import base64
import binascii
import io
import logging
import posixpath
import shlex
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field

from opencode_env.sandbox.base import Identity, Sandbox
from opencode_env.wire.grading import FindingKind, IntegrityFinding, capped

log = logging.getLogger("opencode_env.rollout.grading.integrity")

CONTENT_LIMIT = 256 * 1024
"""Files up to this size are kept whole (config files); larger ones and bytecode are compared by size and mtime."""
SCAN_OUTPUT_LIMIT = 32 * 2**20
SCAN_TIMEOUT_S = 120.0

CONFIG_NAMES = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "setup.cfg", "tox.ini")
STARTUP_NAMES = ("sitecustomize.py", "usercustomize.py", "sitecustomize", "usercustomize")
SHADOW_NAMES = ("pytest", "_pytest", "pluggy", "iniconfig", "unittest", "doctest", "py")
"""Packages (or modules, NAME.py) a grader imports; `py` as py.py only (pytest's shim)."""
BYTECODE_DIR = "__pycache__"
GRADER_CONFIG_NAMES = frozenset({*CONFIG_NAMES, *STARTUP_NAMES})
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
GIT_FILES = (".git/config", ".git/config.worktree", ".git/commondir", ".git/info/attributes", ".git/hooks")


def _name_tests() -> list[str]:
    names = [*CONFIG_NAMES, "conftest.py", *STARTUP_NAMES, "*.pth", "*.pyc", "*.pyo", BYTECODE_DIR]
    names += [f"*{suffix}" for suffix in METADATA_SUFFIXES]
    names += [f"{name}.py" for name in SHADOW_NAMES] + [name for name in SHADOW_NAMES if name != "py"]
    tests = [f"-name {shlex.quote(name)}" for name in names]
    under = [BYTECODE_DIR, *(f"*{suffix}" for suffix in METADATA_SUFFIXES[:2])]
    under += [name for name in SHADOW_NAMES if name != "py"]
    tests += [f"-path {shlex.quote(f'*/{name}/*')}" for name in under]
    return tests


RECORD = "%y %s %T@ %p\\0"
SMALL_FILE = f"-type f -size -{CONTENT_LIMIT // 1024 + 1}k ! -name '*.pyc' ! -name '*.pyo'"


def _matches(action: str) -> str:
    """Every grader file in the work dir (from its root), then the repository's config and hooks: `action` each."""
    names = " -o ".join(_name_tests())
    git = " ".join(shlex.quote(path) for path in GIT_FILES)
    return (
        f"{{ find . -path ./.git -prune -o \\( {names} \\) {action} 2>/dev/null; "
        f"if [ -d .git ] && [ ! -L .git ]; then find {git} -maxdepth 1 {action} 2>/dev/null; "
        f"elif [ -e .git ] || [ -L .git ]; then find .git -maxdepth 0 {action}; fi; true; }}"
    )


def scan_command(workdir: str) -> str:
    """Prints two lines: base64 of the records (`TYPE SIZE MTIME PATH`, NUL-terminated), base64 of a tar of the
    small regular files among them (bytecode excepted). Unreadable entries are left out, never a failure."""
    records, small = _matches(f"-printf '{RECORD}'"), _matches(f"{SMALL_FILE} -print0")
    return (
        "find / -maxdepth 0 -printf '' 2>/dev/null && command -v tar >/dev/null && printf '' | base64 -w 0 "
        "|| { echo 'this image lacks GNU find, tar or base64' >&2; exit 3; }\n"
        f"cd {shlex.quote(workdir)} 2>/dev/null || exit 0\n"
        f"{records} | base64 -w 0; echo\n"
        f"{small} "
        "| tar --null --no-recursion --ignore-failed-read -T - -cf - 2>/dev/null | base64 -w 0; echo\n"
    )


@dataclass(frozen=True)
class Entry:
    kind: str
    size: int
    mtime: str


@dataclass
class Listing:
    entries: dict[str, Entry] = field(default_factory=dict)
    contents: dict[str, bytes] = field(default_factory=dict)


def parse_listing(stdout: str) -> Listing:
    """The scan's two lines into entries and contents; paths are `str` with surrogate escapes (exact bytes)."""
    lines = stdout.strip("\n").split("\n")
    records_b64, tar_b64 = [*lines, "", ""][:2]
    listing = Listing()
    try:
        records = base64.b64decode(records_b64, validate=True)
        archive = base64.b64decode(tar_b64, validate=True)
    except binascii.Error as error:
        raise ValueError(f"the grader's listing came back damaged: {error}") from error
    for record in records.split(b"\0"):
        parts = record.split(b" ", 3)
        if len(parts) != 4:
            continue
        kind, size, mtime, raw_path = parts
        path = posixpath.normpath(raw_path.decode("utf-8", "surrogateescape"))
        listing.entries[path] = Entry(kind.decode(), int(size), mtime.decode())
    if archive:
        with tarfile.open(fileobj=io.BytesIO(archive), encoding="utf-8", errors="surrogateescape") as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isreg() else None
                if handle is not None:
                    listing.contents[posixpath.normpath(member.name)] = handle.read()
    return listing


def finding_kind(path: str) -> FindingKind:
    parts = path.split("/")
    name = parts[-1]
    if parts[0] == ".git":
        return "git_hook" if len(parts) > 1 and parts[1] == "hooks" else "git_config"
    if BYTECODE_DIR in parts or name.endswith((".pyc", ".pyo")):
        return "bytecode"
    if any(part.endswith(METADATA_SUFFIXES) for part in parts):
        return "package_metadata"
    if name == "conftest.py":
        return "conftest"
    if name in CONFIG_NAMES:
        return "test_config"
    if name in STARTUP_NAMES or name.endswith(".pth"):
        return "startup_hook"
    return "shadow_module"


@dataclass
class Repair:
    findings: list[IntegrityFinding] = field(default_factory=list)
    restore: dict[str, str] = field(default_factory=dict)
    """Relative path -> the task's text, written back by the hand-over."""
    remove: list[str] = field(default_factory=list)


def _shown(path: str) -> str:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _kept_by_task(path: str, solution_files: Iterable[str]) -> bool:
    return any(path == wanted or path.startswith(wanted.rstrip("/") + "/") for wanted in solution_files)


def _same(before: Listing, after: Listing, path: str) -> bool:
    old, new = before.entries[path], after.entries[path]
    if old.kind == new.kind == "d":
        return True
    if path in before.contents and path in after.contents:
        return before.contents[path] == after.contents[path]
    return old == new


def repair(before: Listing, after: Listing, solution_files: Iterable[str]) -> Repair:
    """What the agent did to the grader's configuration, and what to write back and remove (pure). All bytecode
    goes, the task's too (a cache, and one whose size and mtime an agent can keep while changing it); a finding is
    made only for what the agent created or changed."""
    wanted = [posixpath.normpath(path) for path in solution_files]
    plan = Repair()
    for path in sorted(set(before.entries) | set(after.entries)):
        kind = finding_kind(path)
        parent_removed = any(parent in plan.remove for parent in _parents(path))
        if path in before.entries and path in after.entries and _same(before, after, path):
            if kind == "bytecode" and not parent_removed and not _kept_by_task(path, wanted):
                plan.remove.append(path)
            continue
        act = "created" if path not in before.entries else "deleted" if path not in after.entries else "changed"
        if _kept_by_task(path, wanted):
            plan.findings.append(IntegrityFinding(path=_shown(path), kind=kind, act=act, response="kept"))
            continue
        if parent_removed:
            continue
        original = before.contents.get(path)
        if act == "created":
            plan.remove.append(path)
            response = "removed"
        elif original is not None and _is_text(original) and before.entries[path].kind == "f":
            plan.restore[path] = original.decode("utf-8")
            response = "restored"
        elif kind == "bytecode" and act == "changed":
            plan.remove.append(path)
            response = "removed"
        else:
            response = "kept"
        plan.findings.append(IntegrityFinding(path=_shown(path), kind=kind, act=act, response=response))
    return plan


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def _is_text(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def removal_command(paths: Iterable[str]) -> str:
    names = b"".join(f"./{path}".encode("utf-8", "surrogateescape") + b"\0" for path in paths)
    encoded = base64.b64encode(names).decode("ascii")
    return f"printf %s {encoded} | base64 -d | xargs -0 -r rm -rf --"


async def scan(sandbox: Sandbox, workdir: str, identity: Identity, timeout_s: float) -> Listing:
    result = await sandbox.run(
        scan_command(workdir), timeout_s=timeout_s, identity=identity, cwd="/", max_output_bytes=SCAN_OUTPUT_LIMIT
    )
    if result.exit_code != 0 or result.output_truncated:
        raise ValueError(f"listing the grader's files failed (exit {result.exit_code}): {result.stderr[-300:]}")
    return parse_listing(result.stdout)


async def check(
    sandbox: Sandbox, *, workdir: str, before: Listing, solution_files: Iterable[str], timeout_s: float
) -> Repair:
    """In a sandbox whose work dir the grader already holds: what the agent did, and what to put back."""
    after = await scan(sandbox, workdir, "grader", timeout_s)
    plan = repair(before, after, solution_files)
    plan.findings = capped(plan.findings)
    return plan


async def remove(sandbox: Sandbox, paths: list[str], *, workdir: str, timeout_s: float) -> None:
    """As the grader, what the agent made (exact names)."""
    if not paths:
        return
    removed = await sandbox.run(removal_command(paths), timeout_s=timeout_s, identity="grader", cwd=workdir)
    if removed.exit_code != 0:
        log.warning("removing the agent's grader files in %s: %s", sandbox.sandbox_id, removed.stderr[-300:])
