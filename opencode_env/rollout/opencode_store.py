"""OpenCode's own record of a run: its sessions (with each sub-agent's parent) and the assistant steps in each.

OpenCode 1.18 keeps them in SQLite at `<data dir>/opencode/opencode.db` (tables `session`: id, parent_id, title;
`message`: id, session_id, time_created, data as JSON with role, finish, tokens, error). The database and its
write-ahead log are copied out of the sandbox through the seam (bounded in size) once the agent has stopped, and
opened read-only on the host with the schema untrusted: a file a sandbox process wrote is data, never code.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from opencode_env.rollout.attribution import OpenCodeStore, StoredStep
from opencode_env.sandbox.base import RolloutSandbox, Sandbox

DATABASE = "opencode.db"
MAX_STORE_BYTES = 64 * 2**20
MAX_ROWS = 100_000


class StoreUnavailable(Exception):
    """The store could not be read; the message says why."""


async def read_store(sandbox: Sandbox) -> OpenCodeStore:
    """The store of the OpenCode run in this sandbox; raises StoreUnavailable with the reason."""
    directory = f"{sandbox.opencode_data_dir}/opencode"
    entries = {entry.path: entry.size for entry in await sandbox.list_files(directory, limit=200)}
    if DATABASE not in entries:
        raise StoreUnavailable(f"OpenCode left no {DATABASE} in its data directory")
    names = [name for name in (DATABASE, f"{DATABASE}-wal") if name in entries]
    if sum(entries[name] for name in names) > MAX_STORE_BYTES:
        raise StoreUnavailable(f"OpenCode's store is over {MAX_STORE_BYTES} bytes")
    with tempfile.TemporaryDirectory(prefix="opencode-store-") as copy:
        for name in names:
            try:
                raw = await sandbox.read_file(f"{directory}/{name}")
            except FileNotFoundError as error:
                raise StoreUnavailable(f"{name} vanished while it was read") from error
            (Path(copy) / name).write_bytes(raw)
        return await asyncio.to_thread(parse_store, Path(copy) / DATABASE)


def parse_store(path: Path) -> OpenCodeStore:
    """Sessions and assistant steps from a copy of the database (its -wal beside it is applied)."""
    try:
        database = sqlite3.connect(f"file:{path}?mode=rw", uri=True)
    except sqlite3.Error as error:
        raise StoreUnavailable(f"OpenCode's store does not open: {error}") from error
    try:
        database.execute("PRAGMA trusted_schema=OFF")
        database.execute("PRAGMA query_only=ON")
        store = OpenCodeStore()
        for session, parent in database.execute("SELECT id, parent_id FROM session LIMIT ?", (MAX_ROWS,)):
            store.parents[str(session)] = str(parent) if parent else None
        rows = database.execute(
            "SELECT session_id, time_created, data FROM message ORDER BY time_created, id LIMIT ?", (MAX_ROWS,)
        )
        for session, created, data in rows:
            step = _step(str(session), created, data)
            if step is not None:
                store.steps.append(step)
        return store
    except sqlite3.Error as error:
        raise StoreUnavailable(f"OpenCode's store does not read as expected: {error}") from error
    finally:
        database.close()


def _step(session: str, created: Any, data: Any) -> StoredStep | None:
    try:
        message = json.loads(data) if isinstance(data, str) else None
    except json.JSONDecodeError:
        return None
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    tokens = message.get("tokens") if isinstance(message.get("tokens"), dict) else {}
    output = tokens.get("output") if isinstance(tokens, dict) else None
    finish = message.get("finish")
    return StoredStep(
        session_id=session,
        created_ms=created if isinstance(created, int) else 0,
        finish=finish if isinstance(finish, str) else None,
        output_tokens=output if isinstance(output, int) and not isinstance(output, bool) else None,
        error=message.get("error") is not None,
    )


async def attribution_store(sandbox: RolloutSandbox) -> tuple[OpenCodeStore | None, str | None]:
    """The store, to label the sessions of a record only OpenCode could have made (attribution.py), else why not.
    OpenCode's own write tool can still reach it through a link, so nothing but labels is taken from it."""
    if not sandbox.opencode_isolated:
        return None, "the agent's tools can write OpenCode's store on this backend: attributed by headers only"
    try:
        return await read_store(sandbox), None
    except StoreUnavailable as error:
        return None, str(error)
