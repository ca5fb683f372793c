"""The agent's work dir carried into the grader's box as data: regular files and directories only, read without
following a link, modes normalised, within caps; what is left behind is a `Skipped` (an integrity finding), and a
tree past a cap must not be graded. Standard library and inside/nofollow.py only, so the local backend runs it in
the server and the cloud backends in the VM (sandbox/cloud/carry.py): one walker decides what crosses everywhere."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol

from opencode_env.inside import nofollow
from opencode_env.inside.nofollow import DIR_FLAGS, FILE_FLAGS

WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE, EXEC_MODE, DIR_MODE = 0o644, 0o755, 0o755
METADATA_NAMES = frozenset({".git", "__pycache__"})
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".pth", ".pyc", ".pyo")
READ_CHUNK = 1 << 20
GIT_CODE_FILES = ("config", "config.worktree", "commondir", "info/attributes")
"""What in a repository makes git run a command (with `hooks/`): compared where the grader box has its own `.git`."""
GIT_CODE_LIMIT = 1 << 20
MAX_HOOKS = 64
SURVEY_MAX_BYTES = 4 * 2**20
Survey = dict[str, dict[str, str]]
"""A relative path in the grader box's work dir -> what stands there: {"link": target} for a link, {"git": digest}
for a `.git`, {} for other metadata."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 256 * 2**20
    max_entries: int = 100_000
    max_depth: int = 64
    max_path_bytes: int = 4096
    max_name_bytes: int = 255


@dataclass(frozen=True)
class Skipped:
    path: str
    """Relative to the work dir; bytes that are not UTF-8 as surrogate escapes."""
    kind: str
    """symlink, fifo, socket, device, hard_link, unreadable, metadata, bytecode, startup_hook, conflict."""


@dataclass
class Report:
    files: int = 0
    dirs: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    over: str = ""
    """The cap the tree went past ('' when within every cap): the copy is incomplete and must not be graded."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> Report:
        raw = json.loads(text)
        skipped = [Skipped(str(item["path"]), str(item["kind"])) for item in raw.get("skipped", [])]
        return cls(int(raw["files"]), int(raw["dirs"]), int(raw["bytes"]), skipped, str(raw.get("over", "")))


class OverLimit(Exception):
    pass


def metadata_kind(name: str) -> str | None:
    """What a name is, when it is repository or packaging metadata or bytecode (any case), else None."""
    folded = name.casefold()
    if folded == "__pycache__" or folded.endswith((".pyc", ".pyo")):
        return "bytecode"
    if folded.endswith(".pth"):
        return "startup_hook"
    if folded in METADATA_NAMES or folded.endswith(METADATA_SUFFIXES):
        return "metadata"
    return None


def excluded_as(relative: str, name: str, is_dir: bool, keep: tuple[str, ...]) -> str | None:
    """What keeps an entry out as metadata (metadata_kind), unless the task declared its path (or one above it) part
    of the solution. A metadata directory holding a declared path is entered, but carries only what is on the way to
    it or under it."""
    if any(relative == wanted or relative.startswith(wanted + "/") for wanted in keep):
        return None
    if is_dir and any(wanted.startswith(relative + "/") for wanted in keep):
        return None
    if keep and any(metadata_kind(part) for part in relative.split("/")[:-1]):
        return "metadata"
    return metadata_kind(name)


class Sink(Protocol):
    def enter(self, relative: str) -> None:
        """A directory at `relative` (its parent entered before)."""
        ...

    def leave(self) -> None: ...

    def has(self, name: str) -> bool:
        """The grader box's own tree holds `name` in the directory entered last (setup's metadata, kept)."""
        ...

    def git_differs(self, source_parent: int, name: str) -> bool:
        """The agent's repository at `name` runs other commands than the grader box's own (git_code)."""
        ...

    def same_link(self, name: str, target: str) -> bool:
        """The grader box's tree holds the same link at `name` (setup's own, kept there)."""
        ...

    def file(self, relative: str, data: bytes, executable: bool) -> bool:
        """False when the entry cannot be made (something of the grader box's own is in the way)."""
        ...


class DirSink:
    """Writes into a directory of ours (the grader box's work dir), every entry created afresh under a descriptor."""

    def __init__(self, root_fd: int, owner: tuple[int, int] | None) -> None:
        self._stack = [root_fd]
        self._owner = owner

    def enter(self, relative: str) -> None:
        name = relative.rsplit("/", 1)[-1]
        parent = self._stack[-1]
        _unlink_unless_dir(parent, name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, DIR_MODE, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        if self._owner is not None:
            os.fchown(fd, *self._owner)
        os.fchmod(fd, DIR_MODE)
        self._stack.append(fd)

    def leave(self) -> None:
        os.close(self._stack.pop())

    def has(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._stack[-1], follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def git_differs(self, source_parent: int, name: str) -> bool:
        return git_code(source_parent, name) != git_code(self._stack[-1], name)

    def same_link(self, name: str, target: str) -> bool:
        try:
            return os.readlink(name, dir_fd=self._stack[-1]) == target
        except OSError:
            return False

    def file(self, relative: str, data: bytes, executable: bool) -> bool:
        name = relative.rsplit("/", 1)[-1]
        mode = EXEC_MODE if executable else FILE_MODE
        parent = self._stack[-1]
        _unlink_unless_dir(parent, name)
        try:
            fd = os.open(name, WRITE_FLAGS, mode, dir_fd=parent)
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ELOOP, errno.EISDIR):
                return False
            raise
        with os.fdopen(fd, "wb") as handle:
            if self._owner is not None:
                os.fchown(fd, *self._owner)
            os.fchmod(fd, mode)
            handle.write(data)
        return True

    def close(self) -> None:
        while len(self._stack) > 1:
            self.leave()


def _unlink_unless_dir(parent: int, name: str) -> None:
    """Setup's own file or link at a path the agent's copy fills is replaced (the link itself, never followed)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=parent)


class TarSink:
    """Writes an uncompressed tar of what crosses: directories and regular files, owner 0, normalised modes. The grader
    box's survey (made there, see `survey`) answers for its tree what that tree itself answers for a DirSink."""

    def __init__(self, tar: tarfile.TarFile, grader_survey: Survey | None = None) -> None:
        self._tar = tar
        self._survey = grader_survey or {}
        self._entered: list[str] = []

    def _path(self, name: str) -> str:
        return f"{self._entered[-1]}/{name}" if self._entered else name

    def enter(self, relative: str) -> None:
        info = tarfile.TarInfo(relative)
        info.type, info.mode = tarfile.DIRTYPE, DIR_MODE
        self._tar.addfile(info)
        self._entered.append(relative)

    def leave(self) -> None:
        self._entered.pop()

    def has(self, name: str) -> bool:
        return self._path(name) in self._survey

    def git_differs(self, source_parent: int, name: str) -> bool:
        return self._survey.get(self._path(name), {}).get("git") != git_digest(source_parent, name)

    def same_link(self, name: str, target: str) -> bool:
        return self._survey.get(self._path(name), {}).get("link") == target

    def file(self, relative: str, data: bytes, executable: bool) -> bool:
        info = tarfile.TarInfo(relative)
        info.size, info.mode = len(data), EXEC_MODE if executable else FILE_MODE
        self._tar.addfile(info, io.BytesIO(data))
        return True


def survey(root_fd: int, limits: Limits, keep: tuple[str, ...] = ()) -> Survey:
    """What a copy meets in the grader box's work dir and leaves in place, by relative path, as `clear` leaves it: each
    link (with its target), each metadata entry (a `.git` with its git_code's digest) and, where `keep` leads into
    one, everything on the way; each directory left holding any of them. Made in the grader's box for a copy packed
    in another (the cloud's route). It stops at max_entries, max_depth or SURVEY_MAX_BYTES of JSON: what it missed
    can only add findings, never carry a file."""
    found: Survey = {}
    size = entries = 0
    stack = [_SurveyLevel(os.dup(root_fd), os.scandir(root_fd), "", intact=False, recorded=0)]
    try:
        while stack:
            level = stack[-1]
            entry = next(level.listing, None)
            if entry is None:
                stack.pop().close()
                if level.prefix and not level.intact and len(found) > level.recorded:
                    found[level.prefix[:-1]] = {}
                continue
            entries += 1
            if entries > limits.max_entries:
                break
            relative = level.prefix + entry.name
            is_link = entry.is_symlink()
            kept = level.intact or is_link or metadata_kind(entry.name) is not None
            if kept:
                mark = {"link": os.readlink(entry.name, dir_fd=level.fd)} if is_link else {}
                if entry.name.casefold() == ".git":
                    mark["git"] = git_digest(level.fd, entry.name)
                size += len(json.dumps(relative)) + len(json.dumps(mark)) + 2
                if size > SURVEY_MAX_BYTES:
                    break
                found[relative] = mark
            descend = not kept or any(
                wanted == relative or wanted.startswith(relative + "/") or relative.startswith(wanted + "/")
                for wanted in keep
            )
            if descend and not is_link and entry.is_dir(follow_symlinks=False) and len(stack) < limits.max_depth:
                child = os.open(entry.name, DIR_FLAGS, dir_fd=level.fd)
                stack.append(_SurveyLevel(child, os.scandir(child), relative + "/", kept, len(found)))
    finally:
        for level in stack:
            level.close()
    return found


@dataclass
class _SurveyLevel:
    fd: int
    listing: Iterator[os.DirEntry[str]]
    prefix: str
    intact: bool
    """Under a metadata directory, which `clear` leaves whole."""
    recorded: int

    def close(self) -> None:
        self.listing.close()  # type: ignore[attr-defined]
        os.close(self.fd)


@dataclass
class _Level:
    fd: int
    prefix: str
    depth: int
    listing: Iterator[os.DirEntry[str]]

    def close(self) -> None:
        """The listing's own descriptor (a dup scandir makes) and ours."""
        self.listing.close()  # type: ignore[attr-defined]
        os.close(self.fd)


def carry(source_fd: int, sink: Sink, limits: Limits, keep: tuple[str, ...] = ()) -> Report:
    """Walk the tree under `source_fd` (a directory descriptor, which stays the caller's) into `sink`, depth first,
    iteratively, with at most max_depth + 1 descriptors open."""
    report = Report()
    budget = _Budget(limits, report)
    stack = [_Level(os.dup(source_fd), "", 0, os.scandir(source_fd))]
    try:
        while stack:
            level = stack[-1]
            entry = next(level.listing, None)
            if entry is None:
                stack.pop().close()
                if stack:
                    sink.leave()
                continue
            child = _visit(level, entry.name, sink, budget, keep)
            if child is not None:
                stack.append(child)
    except OverLimit as error:
        report.over = str(error)
    finally:
        for level in stack:
            level.close()
    return report


class _Budget:
    def __init__(self, limits: Limits, report: Report) -> None:
        self.limits, self.report, self.entries = limits, report, 0

    def admit(self, relative: str, name: str, depth: int) -> None:
        limits = self.limits
        self.entries += 1
        if self.entries > limits.max_entries:
            raise OverLimit(f"more than {limits.max_entries} entries")
        if depth > limits.max_depth:
            raise OverLimit(f"deeper than {limits.max_depth} directories ({_shown(relative)[:200]})")
        if len(os.fsencode(name)) > limits.max_name_bytes:
            raise OverLimit(f"a name longer than {limits.max_name_bytes} bytes ({_shown(name)[:200]})")
        if len(os.fsencode(relative)) > limits.max_path_bytes:
            raise OverLimit(f"a path longer than {limits.max_path_bytes} bytes ({_shown(relative)[:200]}...)")

    def take(self, size: int) -> None:
        self.report.bytes += size
        if self.report.bytes > self.limits.max_bytes:
            raise OverLimit(f"more than {self.limits.max_bytes} bytes")


def _shown(path: str) -> str:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _visit(level: _Level, name: str, sink: Sink, budget: _Budget, keep: tuple[str, ...]) -> _Level | None:
    relative = level.prefix + name
    depth = level.depth + 1
    budget.admit(relative, name, depth)
    report = budget.report
    try:
        info = os.stat(name, dir_fd=level.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    metadata = excluded_as(relative, name, stat.S_ISDIR(info.st_mode), keep)
    kind = _odd_kind(info.st_mode) or metadata
    if kind is None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        kind = "hard_link"
    if kind == "symlink" and sink.same_link(name, os.readlink(name, dir_fd=level.fd)):
        return None
    if kind is not None:
        if not (metadata and sink.has(name)):
            report.skipped.append(Skipped(relative, kind))
        elif name.casefold() == ".git" and sink.git_differs(level.fd, name):
            report.skipped.append(Skipped(relative, "changed_git"))
        return None
    if stat.S_ISDIR(info.st_mode):
        return _enter(level, name, relative=relative, depth=depth, sink=sink, report=report)
    data = _read(level.fd, name, info, budget)
    if data is None:
        report.skipped.append(Skipped(relative, "unreadable"))
    elif sink.file(relative, data, bool(info.st_mode & 0o111)):
        report.files += 1
    else:
        report.skipped.append(Skipped(relative, "conflict"))
    return None


def git_code(parent: int, name: str) -> tuple[object, ...]:
    """What of the repository at parent/name can run a command: its config files' bytes and its hooks (names and
    bytes), each read without following a link, bounded; a `.git` that is not a plain directory is only its kind."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        return ("absent",) if error.errno == errno.ENOENT else ("not a directory",)
    try:
        files = tuple(_small_file(fd, path) for path in GIT_CODE_FILES)
        try:
            hooks_fd = os.open("hooks", DIR_FLAGS, dir_fd=fd)
        except OSError:
            return (*files, None)
        try:
            with os.scandir(hooks_fd) as listing:
                names = sorted(entry.name for _, entry in zip(range(MAX_HOOKS), listing, strict=False))
            hooks = tuple((hook, _small_file(hooks_fd, hook)) for hook in names)
        finally:
            os.close(hooks_fd)
        return (*files, hooks)
    finally:
        os.close(fd)


def git_digest(parent: int, name: str) -> str:
    """git_code as a short text: what a survey carries across hosts."""
    code = repr(git_code(parent, name)).encode("utf-8", "backslashreplace")
    return hashlib.sha256(code).hexdigest()


def _small_file(parent: int, path: str) -> bytes | str | None:
    parts = path.split("/")
    try:
        at = nofollow.open_dir(parent, parts[:-1])
    except nofollow.StepFailed as failed:
        return None if failed.error.errno == errno.ENOENT else f"errno {failed.error.errno}"
    try:
        fd = nofollow.open_file(at, parts[-1])
    except nofollow.NotRegular:
        return "not a regular file"
    except OSError as error:
        return None if error.errno == errno.ENOENT else f"errno {error.errno}"
    finally:
        os.close(at)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        return handle.read(GIT_CODE_LIMIT)


def _odd_kind(mode: int) -> str | None:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return None if stat.S_ISDIR(mode) or stat.S_ISREG(mode) else "device"


def _enter(level: _Level, name: str, *, relative: str, depth: int, sink: Sink, report: Report) -> _Level | None:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=level.fd)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES, errno.EPERM):
            report.skipped.append(Skipped(relative, "unreadable"))
            return None
        raise
    try:
        listing = os.scandir(fd)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EACCES, errno.EPERM):
            report.skipped.append(Skipped(relative, "unreadable"))
            return None
        raise
    try:
        sink.enter(relative)
    except OSError as error:
        listing.close()
        os.close(fd)
        if error.errno in (errno.EACCES, errno.EPERM, errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
            unreadable = error.errno in (errno.EACCES, errno.EPERM)
            report.skipped.append(Skipped(relative, "unreadable" if unreadable else "conflict"))
            return None
        raise
    report.dirs += 1
    return _Level(fd, relative + "/", depth, listing)


def _read(parent: int, name: str, seen: os.stat_result, budget: _Budget) -> bytes | None:
    """The file's bytes up to the size fstat gives, or None when it is not the regular file lstat saw."""
    try:
        fd = nofollow.open_file(parent, name)
    except nofollow.NotRegular:
        return None
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM):
            return None
        raise
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
            return None
        budget.take(info.st_size)
        chunks, left = [], info.st_size
        while left > 0:
            chunk = handle.read(min(left, READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def clear(root_fd: int) -> None:
    """Empty the grader box's work dir of everything but metadata (setup's `.git`, an egg-info of `pip install -e`)
    and links (a repository's own symlinks): the task's own, kept where the agent's are not carried (a file of the
    agent's at a link's path replaces the link itself). A directory left holding none is removed; nothing is
    followed."""
    stack = [(os.dup(root_fd), os.scandir(root_fd), "")]
    try:
        while stack:
            fd, listing, _ = stack[-1]
            entry = next(listing, None)
            if entry is None:
                listing.close()
                os.close(fd)
                name = stack.pop()[2]
                if stack:
                    with contextlib.suppress(OSError):
                        os.rmdir(name, dir_fd=stack[-1][0])
                continue
            if metadata_kind(entry.name) is not None or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                stack.append((child, os.scandir(child), entry.name))
                continue
            os.unlink(entry.name, dir_fd=fd)
    finally:
        for fd, listing, _ in stack:
            listing.close()
            os.close(fd)


def unpack(archive: io.BufferedIOBase, sink: Sink, limits: Limits) -> Report:
    """A tar that `pack` made, into `sink`: directories and regular files only, names checked again (the archive
    crossed the host, but it came out of the agent's VM)."""
    report = Report()
    budget = _Budget(limits, report)
    entered: list[str] = []
    try:
        with tarfile.open(fileobj=archive, mode="r|", errors="surrogateescape") as tar:
            for member in tar:
                parts = member.name.split("/")
                if any(part in ("", ".", "..") for part in parts) or not (member.isdir() or member.isreg()):
                    raise ValueError(f"the work dir's archive holds an entry we never pack: {member.name[:200]!r}")
                while entered and not member.name.startswith(entered[-1] + "/"):
                    entered.pop()
                    sink.leave()
                budget.admit(member.name, parts[-1], len(parts))
                if member.isdir():
                    sink.enter(member.name)
                    entered.append(member.name)
                    report.dirs += 1
                    continue
                budget.take(member.size)
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                if sink.file(member.name, data, bool(member.mode & 0o111)):
                    report.files += 1
                else:
                    report.skipped.append(Skipped(member.name, "conflict"))
    except OverLimit as error:
        report.over = str(error)
    return report


def main(argv: list[str]) -> int:
    """`survey TARGET LIMITS_JSON KEEP_JSON`: prints the grader box's survey, one line.
    `pack SOURCE LIMITS_JSON KEEP_JSON [SURVEY_FILE]`: prints the tar's base64, then the report, one line each.
    `unpack ARCHIVE TARGET LIMITS_JSON UID`: empties TARGET (its metadata kept), unpacks, prints the report."""
    command, first, second, third, *rest = argv
    if command == "survey":
        target = os.open(first, DIR_FLAGS)
        sys.stdout.write(json.dumps(survey(target, Limits(**json.loads(second)), tuple(json.loads(third)))) + "\n")
        return 0
    if command == "pack":
        packed = io.BytesIO()
        source = os.open(first, DIR_FLAGS)
        grader_survey = _read_survey(rest[0]) if rest else {}
        with tarfile.open(fileobj=packed, mode="w|", format=tarfile.PAX_FORMAT, errors="surrogateescape") as tar:
            sink = TarSink(tar, grader_survey)
            report = carry(source, sink, Limits(**json.loads(second)), tuple(json.loads(third)))
        encoded = b"" if report.over else base64.b64encode(packed.getvalue())
        sys.stdout.write(encoded.decode("ascii") + "\n")
    elif command == "unpack":
        target = os.open(second, DIR_FLAGS)
        clear(target)
        owner = (int(rest[0]), int(rest[0]))
        archive_fd = os.open(first, FILE_FLAGS)
        with os.fdopen(archive_fd, "rb") as archive:
            dir_sink = DirSink(target, owner)
            try:
                report = unpack(archive, dir_sink, Limits(**json.loads(third)))
            finally:
                dir_sink.close()
    else:
        raise SystemExit(f"unknown command {command!r}")
    sys.stdout.write(report.to_json() + "\n")
    return 0


def _read_survey(path: str) -> Survey:
    fd = os.open(path, FILE_FLAGS)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SystemExit(f"the survey at {path} is not a regular file")
        data = handle.read(2 * SURVEY_MAX_BYTES + 1)
    if len(data) > 2 * SURVEY_MAX_BYTES:
        raise SystemExit(f"the survey at {path} is over {2 * SURVEY_MAX_BYTES} bytes")
    loaded = json.loads(data)
    return {str(path): {str(key): str(value) for key, value in mark.items()} for path, mark in loaded.items()}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
