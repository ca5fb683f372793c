"""Collecting what a rollout left behind: the work dir's files (bounded) and log tails.

Whatever the sandbox made, what is collected serialises: a text file is one that is valid UTF-8 without NUL bytes,
a path that is not UTF-8 (a backend gives its bytes as lone surrogates, as the os module does) is listed apart with
its bytes in base64, and log tails are decoded with replacement characters.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from opencode_env.sandbox.base import WORKDIR, Sandbox, SandboxError
from opencode_env.sandbox.output import tail_text
from opencode_env.wire import NonUtf8Path

MAX_FILES = 200
MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 4 * 1024 * 1024
MAX_READ_BYTES = 4 * MAX_TOTAL_BYTES
"""Bytes read in all, text or not: past it, files are only listed (binary files would otherwise cost 800 reads)."""
SKIPPED_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv"})
LOG_TAIL_BYTES = 8192
MAX_ARTIFACT_FILES = 100
MAX_ARTIFACT_FILE_BYTES = 1024 * 1024
MAX_ARTIFACT_BYTES = 4 * 1024 * 1024


@dataclass
class CollectedFiles:
    text: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    non_utf8: list[NonUtf8Path] = field(default_factory=list)


def _skipped(path: str) -> bool:
    return any(part in SKIPPED_DIRS for part in path.split("/")[:-1])


def decode_text(raw: bytes) -> str | None:
    """The file as text, or None when it is binary (a NUL byte or invalid UTF-8)."""
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def non_utf8_path(path: str) -> NonUtf8Path | None:
    """The listed form of a path that is not UTF-8; None for a UTF-8 path, which is listed as it is."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raw = _path_bytes(path)
        return NonUtf8Path(
            path_base64=base64.b64encode(raw).decode("ascii"), display=raw.decode("utf-8", "backslashreplace")
        )
    return None


def _path_bytes(path: str) -> bytes:
    """The bytes behind a path with lone surrogates: escaped bytes as the os module makes them, else the surrogates
    themselves (a backend that decoded some other way)."""
    try:
        return path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogatepass")


async def collect_files(sandbox: Sandbox, root: str = WORKDIR) -> CollectedFiles:
    """Text files up to the size limits go to `text`; binary, oversized or over-budget files are only listed."""
    collected = CollectedFiles()
    budget, read_budget = MAX_TOTAL_BYTES, MAX_READ_BYTES
    for entry in await sandbox.list_files(root, limit=MAX_FILES * 4):
        if _skipped(entry.path):
            continue
        odd = non_utf8_path(entry.path)
        if odd is not None:
            collected.non_utf8.append(odd)
            continue
        limit = min(MAX_FILE_BYTES, budget, read_budget)
        if len(collected.text) >= MAX_FILES or entry.size > limit:
            collected.extra.append(entry.path)
            continue
        try:
            raw = await sandbox.read_file(f"{root}/{entry.path}")
        except FileNotFoundError:
            continue
        read_budget -= len(raw)
        text = decode_text(raw) if len(raw) <= limit else None
        if text is None:
            collected.extra.append(entry.path)
            continue
        collected.text[entry.path] = text
        budget -= len(raw)
    return collected


@dataclass
class CollectedArtifacts:
    text: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)


async def collect_artifacts(sandbox: Sandbox, paths: list[str]) -> CollectedArtifacts:
    """Each path's regular files (a directory's, walked as the work dir is, or the file itself), by absolute path,
    within MAX_ARTIFACT_FILES and MAX_ARTIFACT_BYTES in all; the backend's reads follow no link. What is left out
    is in `extra`, each with why."""
    collected = CollectedArtifacts()
    budget = MAX_ARTIFACT_BYTES
    for path in paths:
        found = await _artifact_files(sandbox, path)
        if not found:
            collected.extra.append(f"{path}: absent, empty, a link, or not a regular file")
        for full, size in found:
            if (odd := non_utf8_path(full)) is not None:
                collected.extra.append(f"{odd.display}: the path is not UTF-8")
                continue
            if full in collected.text:
                continue
            if len(collected.text) >= MAX_ARTIFACT_FILES or size > min(MAX_ARTIFACT_FILE_BYTES, budget):
                collected.extra.append(f"{full}: over the caps ({size} bytes)")
                continue
            limit = min(MAX_ARTIFACT_FILE_BYTES, budget)
            raw = await _read_artifact(sandbox, full, limit + 1)
            text = decode_text(raw) if raw is not None and len(raw) <= limit else None
            if raw is None or text is None:
                why = "gone" if raw is None else "over the caps" if len(raw) > limit else "binary"
                collected.extra.append(f"{full}: {why}")
                continue
            collected.text[full] = text
            budget -= len(raw)
    return collected


async def _artifact_files(sandbox: Sandbox, path: str) -> list[tuple[str, int]]:
    """(absolute path, size) of the regular files `path` names: a directory's, or the file alone."""
    try:
        entries = await sandbox.list_files(path, limit=MAX_ARTIFACT_FILES + 1)
    except (SandboxError, OSError):
        return []
    if entries:
        return [(f"{path.rstrip('/')}/{entry.path}", entry.size) for entry in entries]
    raw = await _read_artifact(sandbox, path, MAX_ARTIFACT_FILE_BYTES + 1)
    return [] if raw is None else [(path, len(raw))]


async def _read_artifact(sandbox: Sandbox, path: str, limit: int) -> bytes | None:
    """At most `limit` bytes of a regular file; None when it is absent or unsafe (a link, not a regular file)."""
    try:
        return await sandbox.read_tail(path, limit)
    except (FileNotFoundError, SandboxError, OSError):
        return None


async def read_tail(sandbox: Sandbox, path: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The file's last `limit` bytes as text, read without loading the rest; "" when it is absent or unsafe."""
    try:
        return tail_text(await sandbox.read_tail(path, limit), limit)
    except FileNotFoundError:
        return ""
