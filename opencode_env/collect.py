"""Collecting what a rollout left behind: the work dir's files (bounded) and log tails."""

from __future__ import annotations

from dataclasses import dataclass, field

from opencode_env.sandbox.base import WORKDIR, Sandbox
from opencode_env.sandbox.output import tail_text

MAX_FILES = 200
MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 4 * 1024 * 1024
SKIPPED_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv"})
LOG_TAIL_BYTES = 8192


@dataclass
class CollectedFiles:
    text: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)


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


async def collect_files(sandbox: Sandbox, root: str = WORKDIR) -> CollectedFiles:
    """Text files up to the size limits go to `text`; binary, oversized or over-budget files are only listed."""
    collected = CollectedFiles()
    budget = MAX_TOTAL_BYTES
    for entry in await sandbox.list_files(root, limit=MAX_FILES * 4):
        if _skipped(entry.path):
            continue
        if len(collected.text) >= MAX_FILES or entry.size > min(MAX_FILE_BYTES, budget):
            collected.extra.append(entry.path)
            continue
        try:
            raw = await sandbox.read_file(f"{root}/{entry.path}")
        except FileNotFoundError:
            continue
        text = decode_text(raw)
        if text is None:
            collected.extra.append(entry.path)
            continue
        collected.text[entry.path] = text
        budget -= len(raw)
    return collected


async def read_tail(sandbox: Sandbox, path: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The file's last `limit` bytes as text, read without loading the rest; "" when it is absent or unsafe."""
    try:
        return tail_text(await sandbox.read_tail(path, limit), limit)
    except FileNotFoundError:
        return ""
