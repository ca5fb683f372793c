"""The walker that carries the agent's work dir into the grader's box, on real trees in a temporary directory: what
crosses (regular files and directories, modes normalised), what does not (each recorded), the caps, the task's
declared metadata, the tar route the cloud backends take, and the grader box's work dir emptied without following a
link."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencode_env.sandbox import tree_carry
from opencode_env.sandbox.tree_carry import DirSink, Limits, Report, TarSink


@contextlib.contextmanager
def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, tree_carry.DIR_FLAGS)
    try:
        yield fd
    finally:
        os.close(fd)


def carry(source: Path, target: Path, limits: Limits | None = None, keep: tuple[str, ...] = ()) -> Report:
    target.mkdir(exist_ok=True)
    with opened(source) as src, opened(target) as dst:
        sink = DirSink(dst, None)
        try:
            return tree_carry.carry(src, sink, limits or Limits(), keep)
        finally:
            sink.close()


def tree(root: Path) -> dict[str, tuple[str, int]]:
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        kind = "d" if stat.S_ISDIR(info.st_mode) else "f" if stat.S_ISREG(info.st_mode) else "other"
        found[str(path.relative_to(root))] = (kind, stat.S_IMODE(info.st_mode))
    return found


def skipped(report: Report) -> dict[str, str]:
    return {item.path: item.kind for item in report.skipped}


def test_regular_files_and_directories_cross_with_normalised_modes(tmp_path: Path) -> None:
    source = tmp_path / "agent"
    (source / "pkg" / "sub").mkdir(parents=True)
    (source / "pkg" / "sub").chmod(0o700)
    (source / "add.py").write_text("def add(a, b):\n    return a + b\n")
    (source / "add.py").chmod(0o600)
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o4755)
    (source / "pkg" / "sub" / "data.txt").write_bytes(b"\x00\xff" * 10)
    report = carry(source, tmp_path / "grader")
    assert tree(tmp_path / "grader") == {
        "add.py": ("f", 0o644),
        "pkg": ("d", 0o755),
        "pkg/sub": ("d", 0o755),
        "pkg/sub/data.txt": ("f", 0o644),
        "run.sh": ("f", 0o755),
    }
    assert (tmp_path / "grader" / "pkg" / "sub" / "data.txt").read_bytes() == b"\x00\xff" * 10
    assert (report.files, report.dirs, report.skipped, report.over) == (3, 2, [], "")


def test_links_special_files_and_metadata_in_any_case_stay_behind(tmp_path: Path) -> None:
    source = tmp_path / "agent"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "conftest.py").write_text("secret\n")
    (source / "tests").mkdir(parents=True)
    (source / "tests" / "zzz").symlink_to(outside)
    (source / "add.py").symlink_to(outside / "conftest.py")
    os.mkfifo(source / "pipe")
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(source / "sock"))
    (source / "one.py").write_text("x\n")
    os.link(source / "one.py", source / "two.py")
    for name in (".git", "Evil.DIST-INFO", "x.Egg-Info", "__PYCACHE__"):
        (source / name).mkdir()
        (source / name / "inside").write_text("x\n")
    for name in ("zz.PTH", "m.pyc", "n.PYO"):
        (source / name).write_text("import os\n")
    report = carry(source, tmp_path / "grader")
    assert tree(tmp_path / "grader") == {"tests": ("d", 0o755)}
    assert skipped(report) == {
        "tests/zzz": "symlink",
        "add.py": "symlink",
        "pipe": "fifo",
        "sock": "socket",
        "one.py": "hard_link",
        "two.py": "hard_link",
        ".git": "metadata",
        "Evil.DIST-INFO": "metadata",
        "x.Egg-Info": "metadata",
        "__PYCACHE__": "bytecode",
        "zz.PTH": "startup_hook",
        "m.pyc": "bytecode",
        "n.PYO": "bytecode",
    }
    assert (outside / "conftest.py").read_text() == "secret\n"


def test_declared_metadata_crosses_and_nothing_beside_it(tmp_path: Path) -> None:
    source = tmp_path / "agent"
    (source / ".git" / "info").mkdir(parents=True)
    (source / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
    (source / ".git" / "info" / "exclude").write_text("build/\n")
    (source / "site.pth").write_text("# the solution\n")
    (source / "other.pth").write_text("import evil\n")
    report = carry(source, tmp_path / "grader", keep=("site.pth", ".git/info/exclude"))
    assert set(tree(tmp_path / "grader")) == {"site.pth", ".git", ".git/info", ".git/info/exclude"}
    assert skipped(report) == {"other.pth": "startup_hook", ".git/config": "metadata"}


def test_the_grader_boxs_own_metadata_and_links_are_kept_and_a_changed_git_recorded(tmp_path: Path) -> None:
    source, target = tmp_path / "agent", tmp_path / "grader"
    for root, config in ((source, '[filter "x"]\n\tclean = evil\n'), (target, "[core]\n")):
        (root / ".git").mkdir(parents=True)
        (root / ".git" / "config").write_text(config)
    (target / "stale.py").write_text("setup's\n")
    (target / "dir").mkdir()
    (target / "dir" / "old.txt").write_text("setup's\n")
    (target / "escape").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("untouched\n")
    (target / "vendor").symlink_to(tmp_path / "outside")
    (source / "vendor").symlink_to(tmp_path / "outside")
    (source / "escape").write_text("the agent's file\n")
    with opened(target) as dst:
        tree_carry.clear(dst)
    assert set(tree(target)) == {".git", ".git/config", "escape", "vendor"}, "setup's links and metadata stay"
    report = carry(source, target)
    assert skipped(report) == {".git": "changed_git"}, "the task's own link is no finding"
    assert (target / ".git" / "config").read_text() == "[core]\n"
    assert tree(target)["escape"] == ("f", 0o644), "the agent's file replaces the link itself"
    assert (target / "vendor").is_symlink()
    assert sorted(path.name for path in (tmp_path / "outside").iterdir()) == ["keep.txt"]
    assert (tmp_path / "outside" / "keep.txt").read_text() == "untouched\n"


@pytest.mark.parametrize(
    ("limits", "make", "over"),
    [
        (Limits(max_bytes=10), lambda root: (root / "big").write_bytes(b"x" * 11), "bytes"),
        (Limits(max_entries=3), lambda root: [(root / f"f{i}").touch() for i in range(4)], "entries"),
        (Limits(max_depth=2), lambda root: (root / "a" / "b" / "c").mkdir(parents=True), "deeper"),
        (Limits(max_path_bytes=8), lambda root: (root / "abcd" / "efgh").mkdir(parents=True), "path longer"),
        (Limits(max_name_bytes=4), lambda root: (root / "abcde").touch(), "name longer"),
    ],
    ids=["bytes", "entries", "depth", "path", "name"],
)
def test_a_tree_past_a_cap_stops_the_copy(tmp_path: Path, limits: Limits, make: object, over: str) -> None:
    source = tmp_path / "agent"
    source.mkdir()
    make(source)  # type: ignore[operator]
    assert over in carry(source, tmp_path / "grader", limits).over


def test_the_tar_route_carries_the_same_tree_and_refuses_what_it_never_packs(tmp_path: Path) -> None:
    source = tmp_path / "agent"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("x = 1\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o700)
    (source / "link").symlink_to("/etc/passwd")
    packed = io.BytesIO()
    with opened(source) as src, tarfile.open(fileobj=packed, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        report = tree_carry.carry(src, TarSink(tar), Limits())
    assert skipped(report) == {"link": "symlink"}
    (tmp_path / "grader").mkdir()
    with opened(tmp_path / "grader") as dst:
        sink = DirSink(dst, None)
        landed = tree_carry.unpack(io.BytesIO(packed.getvalue()), sink, Limits())
        sink.close()
    assert landed.files == 2
    assert tree(tmp_path / "grader") == {"pkg": ("d", 0o755), "pkg/mod.py": ("f", 0o644), "run.sh": ("f", 0o755)}
    hostile = io.BytesIO()
    with tarfile.open(fileobj=hostile, mode="w") as tar:
        member = tarfile.TarInfo("escape")
        member.type, member.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(member)
    (tmp_path / "again").mkdir()
    with opened(tmp_path / "again") as dst, pytest.raises(ValueError, match="never pack"):
        tree_carry.unpack(io.BytesIO(hostile.getvalue()), DirSink(dst, None), Limits())


NAMES = (".git", ".Git", "__pycache__", "m.egg-info", "site.pth", "pkg", "mod.py", "link")
Node = tuple[str, object]
"""("file", text) | ("dir", {name: Node}) | ("link", target) | ("git", config)."""


def _nodes(depth: int) -> st.SearchStrategy[dict[str, Node]]:
    leaf = st.one_of(
        st.tuples(st.just("file"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("link"), st.sampled_from(["/etc", "pkg", "../x"])),
        st.tuples(st.just("git"), st.sampled_from(["[core]\n", '[filter "x"]\n\tclean = evil\n'])),
    )
    node = leaf if depth == 0 else st.one_of(leaf, st.tuples(st.just("dir"), st.deferred(lambda: _nodes(depth - 1))))
    return st.dictionaries(st.sampled_from(NAMES), node, max_size=4)


def _build(root: Path, nodes: dict[str, Node]) -> None:
    root.mkdir(exist_ok=True)
    for name, (kind, value) in nodes.items():
        path = root / name
        if kind == "file":
            path.write_text(str(value))
        elif kind == "link":
            path.symlink_to(str(value))
        elif kind == "git":
            (path / "hooks").mkdir(parents=True)
            (path / "config").write_text(str(value))
        else:
            _build(path, value)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    agent=_nodes(2),
    grader=_nodes(2),
    keep=st.sampled_from([(), (".git/config",), ("pkg/__pycache__",), ("site.pth",)]),
)
def test_the_cloud_route_reports_what_the_local_route_reports(
    tmp_path_factory: pytest.TempPathFactory, agent: dict[str, Node], grader: dict[str, Node], keep: tuple[str, ...]
) -> None:
    """Any two trees: the tar route (packed in the agent's box against the grader box's survey, unpacked in the
    grader's, as the cloud backends carry it) leaves the same tree and records the same entries not carried as the
    local route, which sees the grader's tree itself: setup's `.git`, links and bytecode in both boxes are no
    finding on either."""
    root = tmp_path_factory.mktemp("trees")
    source, local_target, cloud_target = root / "agent", root / "local", root / "cloud"
    _build(source, agent)
    _build(local_target, grader)
    _build(cloud_target, grader)
    with opened(local_target) as dst:
        tree_carry.clear(dst)
    local = carry(source, local_target, keep=keep)
    packed = io.BytesIO()
    with opened(cloud_target) as dst:
        surveyed = tree_carry.survey(dst, Limits(), keep)
    with opened(source) as src, tarfile.open(fileobj=packed, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        cloud = tree_carry.carry(src, TarSink(tar, surveyed), Limits(), keep)
    with opened(cloud_target) as dst:
        tree_carry.clear(dst)
        sink = DirSink(dst, None)
        landed = tree_carry.unpack(io.BytesIO(packed.getvalue()), sink, Limits())
        sink.close()
    assert {**skipped(cloud), **skipped(landed)} == skipped(local)
    assert landed.files == local.files
    assert tree(cloud_target) == tree(local_target)


def test_a_survey_holds_links_metadata_and_the_directories_holding_them_and_nothing_under_them(tmp_path: Path) -> None:
    _build(
        tmp_path / "grader",
        {
            ".git": ("git", "[core]\n"),
            "pkg": ("dir", {"__pycache__": ("dir", {"mod.pyc": ("file", "a")}), "mod.py": ("file", "a")}),
            "link": ("link", "/etc"),
        },
    )
    with opened(tmp_path / "grader") as dst:
        surveyed = tree_carry.survey(dst, Limits())
        git = tree_carry.git_digest(dst, ".git")
    assert surveyed == {".git": {"git": git}, "pkg": {}, "pkg/__pycache__": {}, "link": {"link": "/etc"}}
    with opened(tmp_path / "grader") as dst:
        assert tree_carry.survey(dst, Limits(max_entries=1)).keys() <= {".git", "pkg", "link"}
