"""hostfs against trees a hostile sandbox can leave: links, files, fifos and sockets where directories belong, hard
links, odd modes, very deep and wide trees. Every test runs on real directories, as root (as the server runs), with
a directory outside the base standing for the host: nothing in it may change."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from opencode_env.sandbox.local.files import hostfs, hostfs_write

OWNER = (2_100_000_001, 2_100_000_001)
OTHER = (2_100_000_777, 2_100_000_777)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "base"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory with a file in it, owned by root: every test checks it is left exactly as it was."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("host secret\n")
    (path / "verifier").mkdir()
    (path / "verifier" / "kept.txt").write_text("kept\n")
    return path


def snapshot(path: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry under path with its mode, owner, group and (for files) content."""
    found = {}
    for entry in sorted(path.rglob("*")):
        info = entry.lstat()
        content = entry.read_bytes() if stat.S_ISREG(info.st_mode) else b""
        found[str(entry.relative_to(path))] = (info.st_mode, info.st_uid, info.st_gid, content)
    return found


def owned_dir(path: Path, mode: int = 0o755) -> bool:
    info = path.lstat()
    return stat.S_ISDIR(info.st_mode) and (info.st_uid, info.st_gid) == OWNER and stat.S_IMODE(info.st_mode) == mode


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))


NOT_A_DIRECTORY: dict[str, Callable[[Path, Path], object]] = {
    "symlink to the host": lambda path, outside: path.symlink_to(outside),
    "dangling symlink": lambda path, outside: path.symlink_to(outside / "missing"),
    "regular file": lambda path, outside: path.write_text("in the way\n"),
    "fifo": lambda path, outside: os.mkfifo(path),
    "socket": lambda path, outside: make_socket(path),
}


@pytest.mark.parametrize("planted", NOT_A_DIRECTORY)
def test_reset_dir_replaces_a_parent_that_is_not_a_directory(base: Path, outside: Path, planted: str) -> None:
    """The agent ran `mv ~/logs ~/logs.old; ln -s /host ~/logs` (or left a file, fifo or socket there)."""
    (base / "logs").mkdir()
    (base / "logs" / "verifier").mkdir()
    (base / "logs" / "verifier" / "old.txt").write_text("old\n")
    (base / "logs").rename(base / "logs.old")
    NOT_A_DIRECTORY[planted](base / "logs", outside)
    before = snapshot(outside)

    hostfs_write.reset_dir(base, "logs/verifier", owner=OWNER)

    assert owned_dir(base / "logs")
    assert owned_dir(base / "logs" / "verifier")
    assert list((base / "logs" / "verifier").iterdir()) == []
    assert snapshot(outside) == before
    assert (base / "logs.old" / "verifier" / "old.txt").read_text() == "old\n"


@pytest.mark.parametrize("planted", NOT_A_DIRECTORY)
def test_reset_dir_replaces_a_leaf_that_is_not_a_directory(base: Path, outside: Path, planted: str) -> None:
    (base / "logs").mkdir()
    NOT_A_DIRECTORY[planted](base / "logs" / "verifier", outside)
    before = snapshot(outside)

    hostfs_write.reset_dir(base, "logs/verifier", owner=OWNER, mode=0o750)

    assert owned_dir(base / "logs" / "verifier", 0o750)
    assert list((base / "logs" / "verifier").iterdir()) == []
    assert snapshot(outside) == before


def test_reset_dir_empties_the_leaf_without_following_links_and_keeps_real_parents(base: Path, outside: Path) -> None:
    logs = base / "logs"
    verifier = logs / "verifier"
    (verifier / "nested" / "deeper").mkdir(parents=True)
    (verifier / "nested" / "deeper" / "reward.txt").write_text("1.0\n")
    (verifier / "to-host").symlink_to(outside)
    (verifier / "nested" / "secret-link").symlink_to(outside / "secret.txt")
    os.link(outside / "secret.txt", verifier / "hard-link")
    (verifier / "nested").chmod(0)
    (logs / "agent.log").write_text("sibling\n")
    os.chown(logs, *OTHER)
    logs.chmod(0o700)
    before = snapshot(outside)

    hostfs_write.reset_dir(base, "logs/verifier", owner=OWNER)

    assert owned_dir(verifier)
    assert list(verifier.iterdir()) == []
    assert snapshot(outside) == before
    assert (logs / "agent.log").read_text() == "sibling\n"
    info = logs.lstat()
    assert ((info.st_uid, info.st_gid), stat.S_IMODE(info.st_mode)) == (OTHER, 0o700)


def test_reset_dir_makes_missing_components_and_applies_its_mode_whatever_the_umask(base: Path) -> None:
    previous = os.umask(0o077)
    try:
        hostfs_write.reset_dir(base, "a/b/c", owner=OWNER, mode=0o775)
    finally:
        os.umask(previous)
    assert owned_dir(base / "a")
    assert owned_dir(base / "a" / "b")
    assert owned_dir(base / "a" / "b" / "c", 0o775)


def test_reset_dir_refuses_a_path_that_climbs_out(base: Path) -> None:
    with pytest.raises(hostfs.UnsafePath):
        hostfs_write.reset_dir(base, "logs/../../outside", owner=OWNER)


def directory_tree(path: Path, outside: Path) -> None:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "link").symlink_to(outside)
    (path / "sub" / "file").write_text("x")


def setuid_file_of_another_owner(path: Path, outside: Path) -> None:
    path.write_text("old\n")
    os.chown(path, *OTHER)
    path.chmod(0o4777)


AT_THE_LEAF: dict[str, Callable[[Path, Path], object]] = {
    **NOT_A_DIRECTORY,
    "symlink to a host file": lambda path, outside: path.symlink_to(outside / "secret.txt"),
    "hard link to a host file": lambda path, outside: os.link(outside / "secret.txt", path),
    "directory tree": directory_tree,
    "setuid file of another owner": setuid_file_of_another_owner,
}


@pytest.mark.parametrize("planted", AT_THE_LEAF)
def test_place_file_replaces_whatever_is_at_the_path(base: Path, outside: Path, planted: str) -> None:
    (base / "workdir" / "tests").mkdir(parents=True)
    target = base / "workdir" / "tests" / "test_it.py"
    AT_THE_LEAF[planted](target, outside)
    before = snapshot(outside)

    hostfs_write.place_file(base, "workdir/tests/test_it.py", b"assert True\n", owner=OWNER, mode=0o640)

    info = target.lstat()
    assert stat.S_ISREG(info.st_mode)
    assert ((info.st_uid, info.st_gid), stat.S_IMODE(info.st_mode), info.st_nlink) == (OWNER, 0o640, 1)
    assert target.read_bytes() == b"assert True\n"
    assert snapshot(outside) == before


def test_a_hard_link_inside_the_tree_keeps_its_other_name(base: Path) -> None:
    (base / "workdir").mkdir()
    (base / "workdir" / "original.py").write_text("the agent's\n")
    os.link(base / "workdir" / "original.py", base / "workdir" / "test_it.py")

    hostfs_write.place_file(base, "workdir/test_it.py", b"protected\n", owner=OWNER)

    assert (base / "workdir" / "original.py").read_text() == "the agent's\n"
    assert (base / "workdir" / "test_it.py").read_text() == "protected\n"


@pytest.mark.parametrize("planted", NOT_A_DIRECTORY)
def test_place_file_replaces_parents_that_are_not_directories(base: Path, outside: Path, planted: str) -> None:
    (base / "workdir").mkdir()
    NOT_A_DIRECTORY[planted](base / "workdir" / "tests", outside)
    before = snapshot(outside)

    hostfs_write.place_file(base, "workdir/tests/data/fixture.json", b"", owner=OWNER)

    assert owned_dir(base / "workdir" / "tests")
    assert owned_dir(base / "workdir" / "tests" / "data")
    assert (base / "workdir" / "tests" / "data" / "fixture.json").read_bytes() == b""
    assert snapshot(outside) == before


def test_chown_tree_gives_every_entry_and_never_a_link_target(base: Path, outside: Path) -> None:
    work = base / "workdir"
    (work / "src" / "locked").mkdir(parents=True)
    (work / "src" / "main.py").write_text("print()\n")
    (work / "src" / "locked" / "inner.txt").write_text("inner\n")
    (work / "host-dir").symlink_to(outside)
    (work / "src" / "host-file").symlink_to(outside / "secret.txt")
    os.mkfifo(work / "pipe")
    make_socket(work / "sock")
    (work / "src" / "locked").chmod(0)
    before = snapshot(outside)

    count = hostfs_write.chown_tree(base, "workdir", owner=OWNER)

    entries = [work, *work.rglob("*")]
    assert count == len(entries) - 1 == 8
    assert {(entry.lstat().st_uid, entry.lstat().st_gid) for entry in entries} == {OWNER}
    assert snapshot(outside) == before


def test_chown_tree_clears_set_id_bits_the_agent_left(base: Path) -> None:
    (base / "workdir").mkdir()
    planted = base / "workdir" / "escalate"
    planted.write_text("#!/bin/sh\n")
    os.chown(planted, *OTHER)
    planted.chmod(0o6755)

    hostfs_write.chown_tree(base, "workdir", owner=OWNER)

    assert stat.S_IMODE(planted.lstat().st_mode) & (stat.S_ISUID | stat.S_ISGID) == 0


@pytest.mark.parametrize("planted", [*NOT_A_DIRECTORY, "nothing"])
def test_chown_tree_of_something_that_is_not_a_directory_makes_an_empty_one(
    base: Path, outside: Path, planted: str
) -> None:
    if planted != "nothing":
        NOT_A_DIRECTORY[planted](base / "workdir", outside)
    before = snapshot(outside)

    assert hostfs_write.chown_tree(base, "workdir", owner=OWNER) == 0

    assert owned_dir(base / "workdir")
    assert list((base / "workdir").iterdir()) == []
    assert snapshot(outside) == before


def test_list_files_gives_names_that_are_not_utf8_back_as_their_bytes(base: Path) -> None:
    work = os.fsencode(base / "work")
    os.mkdir(work)
    os.mkdir(work + b"/dir\xff")
    for name in (b"bin\xe9.txt", b"dir\xff/inner", b"line\nbreak", b"n" * 255):
        with open(work + b"/" + name, "wb") as handle:
            handle.write(b"data")
    (base / "work" / "link").symlink_to("/etc/passwd")

    listed = hostfs.list_files(base, "work", limit=100)

    assert sorted(os.fsencode(entry.path) for entry in listed) == [
        b"bin\xe9.txt",
        b"dir\xff/inner",
        b"line\nbreak",
        b"n" * 255,
    ]
    assert {entry.size for entry in listed} == {4}
