"""Finished results by reference: each kept gzip-compressed under an unguessable id for the operator's retention.

The id is the capability: 256 random bits, handed only to the caller whose rollout it is (in the tool's answer),
and read only with the server's access rule on top (its bearer token, or this machine without one). On disk a
result is named by the SHA-256 of its id, so that a listing of the directory gives no one a readable id.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("opencode_env.server")
REF_PATTERN = re.compile(r"^[A-Za-z0-9_-]{43}$")
DEFAULT_RETENTION_S = 3600.0
GZIP_LEVEL = 1
"""Level 1: ~4 times smaller than the JSON at a small part of its encoding time (bench.wire_format)."""


@dataclass(frozen=True)
class Stored:
    id: str
    json_bytes: int
    gzip_bytes: int
    sha256: str
    expires_at: float


class ResultStore:
    def __init__(self, directory: Path, retention_s: float = DEFAULT_RETENTION_S) -> None:
        if retention_s <= 0:
            raise ValueError(f"the results' retention must be above 0 s, got {retention_s}")
        self.directory, self.retention_s = directory, retention_s
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    @classmethod
    def configured(cls, results_dir: str, retention_s: float) -> ResultStore:
        """Under the operator's results directory when there is one, else in a private temporary directory."""
        if results_dir and Path(results_dir).expanduser().is_absolute():
            return cls(Path(results_dir).expanduser() / "by-reference", retention_s)
        return cls(Path(tempfile.mkdtemp(prefix="opencode-env-results-")), retention_s)

    def put(self, result_json: bytes) -> Stored:
        """Keep one result's JSON; results past their retention are removed on the way."""
        self.sweep()
        ref = secrets.token_urlsafe(32)
        packed = gzip.compress(result_json, compresslevel=GZIP_LEVEL)
        _write_private(self._path(ref), packed)
        return Stored(
            id=ref,
            json_bytes=len(result_json),
            gzip_bytes=len(packed),
            sha256=hashlib.sha256(result_json).hexdigest(),
            expires_at=time.time() + self.retention_s,
        )

    def gzip_of(self, ref: str) -> bytes | None:
        """The gzip stream of the result `ref` names; None for an id that is not one, unknown or expired."""
        if not REF_PATTERN.match(ref):
            return None
        path = self._path(ref)
        try:
            if time.time() - path.stat().st_mtime > self.retention_s:
                path.unlink(missing_ok=True)
                return None
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def sweep(self) -> None:
        cutoff = time.time() - self.retention_s
        with os.scandir(self.directory) as entries:
            old = [
                e.path for e in entries if e.name.endswith(".gz") and e.stat(follow_symlinks=False).st_mtime < cutoff
            ]
        for path in old:
            Path(path).unlink(missing_ok=True)

    def _path(self, ref: str) -> Path:
        return self.directory / f"{hashlib.sha256(ref.encode()).hexdigest()}.gz"


def _write_private(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
