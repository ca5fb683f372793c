"""Finished results on disk, in the server's results directory, each file written whole (a temporary renamed) and
readable by this user only; one writer (`write_privately`) for both of the server's views of them:

- `ResultsDir`, the history the /web page lists: each caller's newest `keep` runs, `<id>.json` (the RolloutResult,
  as `opencode-env view` opens it) beside `<id>.run.json` (its row);
- `ResultStore`, results by reference: each tool answer's result gzip'd under an unguessable id for the operator's
  retention. The id is the capability (256 random bits, handed only to the caller whose rollout it is, read only
  under the server's access rule); on disk it is named by the SHA-256 of its id, so a listing gives no readable id.

A result is never written with a key in it."""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import secrets
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from opencode_env.settings import variable
from opencode_env.viewer.rows import RunView
from opencode_env.wire import RolloutResult

log = logging.getLogger("opencode_env.server")
REF_PATTERN = re.compile(r"^[A-Za-z0-9_-]{43}$")
RUN_ID = re.compile(r"^\d{8}-\d{6}-\d{6}-[0-9a-f]{6}$")
"""A run's id: its start (UTC, to the microsecond) then random hex, so that ids sort by age and name files safely."""
DEFAULT_RETENTION_S = 3600.0
DEFAULT_RESULTS_KEEP = 200
STALE_TEMP_S = 3600.0
GZIP_LEVEL = 1
"""Level 1: ~4 times smaller than the JSON at a small part of its encoding time (bench.wire_format)."""


def write_privately(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all (a reader never sees half a file), mode 0600, on disk before it is
    named."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def remove_older_than(directory: Path, age_s: float, *, suffix: str, dotted: bool = False) -> None:
    """Remove the regular files of `directory` named `*suffix` (`.*suffix` with `dotted`: the temporaries a writer
    killed mid-write left) last written more than `age_s` ago. Other writers rename or remove their files at any
    moment: one gone while this looked is not old."""
    cutoff = time.time() - age_s
    with os.scandir(directory) as entries:
        old = [
            entry.path
            for entry in entries
            if entry.name.endswith(suffix)
            and entry.name.startswith(".") == dotted
            and entry.is_file(follow_symlinks=False)
            and _written_before(entry, cutoff)
        ]
    for path in old:
        Path(path).unlink(missing_ok=True)


def _written_before(entry: os.DirEntry[str], cutoff: float) -> bool:
    try:
        return entry.stat(follow_symlinks=False).st_mtime < cutoff
    except FileNotFoundError:
        return False


def without_key(result: RolloutResult) -> RolloutResult:
    """The pipeline's result never carries the key (its `task` is the request without it); a result made elsewhere
    is held to the same rule before it is kept or written."""
    if result.task is None or not result.task.api_key:
        return result
    return result.model_copy(update={"task": result.task.model_copy(update={"api_key": ""})})


class ResultsDir:
    """Finished runs on disk, for as long as they are among the newest `keep`: `<id>.json` (the RolloutResult, as
    `opencode-env view` opens it) and `<id>.run.json` (its row), each written whole (a temporary file renamed) and
    readable by this user only."""

    def __init__(self, path: Path, keep: int = DEFAULT_RESULTS_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.path, self.keep = path, keep
        self._owners: dict[str, str] = {}
        """The owner of each saved run read so far (a row never changes once written)."""
        path.mkdir(mode=0o700, parents=True, exist_ok=True)

    @classmethod
    def configured(cls, directory: str, keep: int) -> ResultsDir | None:
        """The results directory an operator set (OPENCODE_ENV_RESULTS_DIR; '' is the user's state directory),
        keeping `keep` results (0 keeps none on disk); None, with a warning, when it cannot be made."""
        if keep == 0:
            return None
        path = Path(directory).expanduser() if directory else default_results_dir()
        if not path.is_absolute():
            why = f"{directory!r} is not an absolute path" if directory else "this user has no home directory"
            log.warning("results are kept in memory only: %s; set %s", why, variable("results_dir"))
            return None
        try:
            return cls(path, keep)
        except OSError as error:
            log.warning(
                "results are kept in memory only: cannot make %s (%s); set %s", path, error, variable("results_dir")
            )
            return None

    def load(self, *, warn: bool = True) -> list[RunView]:
        """The rows of each caller's newest `keep` results, oldest first; a file that is not one is skipped (and
        logged, with `warn`: at start, not on every look at what other servers saved)."""
        self._remove_stale_temporaries()
        views = []
        for run_id in self._kept_ids():
            try:
                view = RunView.model_validate_json(self._row(run_id).read_bytes())
            except (OSError, ValidationError) as error:
                if warn:
                    log.warning("skipping the saved run %s: %s", run_id, str(error)[:200])
                continue
            if view.id == run_id and (self.path / f"{run_id}.json").is_file():
                views.append(view)
        return sorted(views, key=lambda view: view.started_at)

    def save(self, view: RunView, result: RolloutResult) -> None:
        """The result, then its row (a row always has its result), then its caller's oldest beyond `keep`
        removed."""
        write_privately(self.path / f"{view.id}.json", without_key(result).model_dump_json().encode())
        write_privately(self._row(view.id), view.model_dump_json().encode())
        self._owners[view.id] = view.owner
        listed = self._ids()
        kept = set(self._kept_ids(listed))
        for run_id in listed:
            if run_id not in kept:
                for path in (self._row(run_id), self.path / f"{run_id}.json"):
                    path.unlink(missing_ok=True)
                self._owners.pop(run_id, None)

    def _kept_ids(self, listed: list[str] | None = None) -> list[str]:
        """The ids of each owner's newest `keep` saved runs among `listed` (default: the directory now), oldest
        first. A save prunes from the one listing it counted: a run another writer adds meanwhile is not in it, so
        it is never taken for one beyond `keep`; nor is a run whose row another writer has yet to write (its result
        is younger than STALE_TEMP_S). Rows that cannot be read, and are older, count as one owner's."""
        seen: Counter[str] = Counter()
        kept = []
        for run_id in reversed(self._ids() if listed is None else listed):
            owner = self._owner(run_id)
            if owner is None and self._written_since(run_id, time.time() - STALE_TEMP_S):
                kept.append(run_id)
                continue
            seen[owner or ""] += 1
            if seen[owner or ""] <= self.keep:
                kept.append(run_id)
        return kept[::-1]

    def _owner(self, run_id: str) -> str | None:
        """Who a saved run belongs to, from its row; None for a row not written yet or that cannot be read."""
        if run_id not in self._owners:
            try:
                self._owners[run_id] = RunView.model_validate_json(self._row(run_id).read_bytes()).owner
            except (OSError, ValidationError):
                return None
        return self._owners[run_id]

    def _written_since(self, run_id: str, moment: float) -> bool:
        try:
            return (self.path / f"{run_id}.json").stat().st_mtime >= moment
        except FileNotFoundError:
            return False

    def read(self, run_id: str) -> bytes | None:
        if not RUN_ID.match(run_id):
            return None
        try:
            return (self.path / f"{run_id}.json").read_bytes()
        except FileNotFoundError:
            return None

    def _row(self, run_id: str) -> Path:
        return self.path / f"{run_id}.run.json"

    def _ids(self) -> list[str]:
        """Every saved run's id, oldest first (a result whose row was never written counts, so it is pruned too)."""
        with os.scandir(self.path) as entries:
            names = [entry.name for entry in entries if entry.is_file(follow_symlinks=False)]
        stems = {name.removesuffix(".json").removesuffix(".run") for name in names if name.endswith(".json")}
        return sorted(stem for stem in stems if RUN_ID.match(stem))

    def _remove_stale_temporaries(self) -> None:
        """What a server killed mid-write left (a live server's temporaries are younger)."""
        remove_older_than(self.path, STALE_TEMP_S, suffix=".tmp", dotted=True)


def default_results_dir() -> Path:
    """The user's state directory's results (not absolute for a user without a home, e.g. a container's numeric
    uid: expanduser leaves "~" as it is)."""
    state = os.environ.get("XDG_STATE_HOME", "") or os.path.expanduser("~/.local/state")
    return Path(state) / "opencode-env" / "results"


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
        write_privately(self._path(ref), packed)
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
        remove_older_than(self.directory, self.retention_s, suffix=".gz")
        remove_older_than(self.directory, STALE_TEMP_S, suffix=".tmp", dotted=True)

    def _path(self, ref: str) -> Path:
        return self.directory / f"{hashlib.sha256(ref.encode()).hexdigest()}.gz"
