"""The one link-safe open (inside/nofollow.py) over generated trees: whatever stands at each component of a path (a
directory, a link to one inside or outside the tree, a file, a FIFO, nothing), a walk reaches only the real
directory the components name without a link, a file open keeps only a regular file, and no descriptor is left open."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.inside import nofollow

KINDS = ("dir", "link_inside", "link_outside", "file", "fifo", "missing")


def plant(at: Path, kind: str, outside: Path) -> None:
    if kind == "dir":
        at.mkdir()
    elif kind == "link_inside":
        (at.parent / f"{at.name}.real").mkdir()
        at.symlink_to(f"{at.name}.real")
    elif kind == "link_outside":
        at.symlink_to(outside)
    elif kind == "file":
        at.write_text("x")
    elif kind == "fifo":
        os.mkfifo(at)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=5), last=st.sampled_from(KINDS))
@settings(max_examples=150, deadline=None)
def test_a_walk_reaches_only_what_the_components_name_without_a_link(kinds: list[str], last: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root, outside = Path(scratch) / "root", Path(scratch) / "outside"
        root.mkdir()
        outside.mkdir()
        (outside / "secret").write_text("s")
        parts, here = [], root
        for index, kind in enumerate(kinds):
            name = f"c{index}"
            plant(here / name, kind, outside)
            parts.append(name)
            if kind != "dir":
                break
            here = here / name
        plain = all(kind == "dir" for kind in kinds[: len(parts)])
        if plain:
            plant(here / "leaf", last, outside / "secret")
        before = open_fds()
        top = os.open(root, nofollow.DIR_FLAGS)
        try:
            if not plain:
                with pytest.raises(nofollow.StepFailed) as failed:
                    nofollow.open_dir(top, parts)
                assert kinds[failed.value.index] != "dir"
            else:
                fd = nofollow.open_dir(top, parts)
                try:
                    assert os.path.samestat(os.fstat(fd), os.stat(here))
                    opened = _open_leaf(fd)
                    assert opened == ("file" if last == "file" else "refused")
                finally:
                    os.close(fd)
        finally:
            os.close(top)
        assert open_fds() == before


def _open_leaf(parent: int) -> str:
    try:
        fd = nofollow.open_file(parent, "leaf")
    except OSError:
        return "refused"
    try:
        assert stat.S_ISREG(os.fstat(fd).st_mode)
        return "file"
    finally:
        os.close(fd)


def test_a_fifo_never_blocks_and_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    top = os.open(tmp_path, nofollow.DIR_FLAGS)
    try:
        with pytest.raises(nofollow.NotRegular):
            nofollow.open_file(top, "pipe")
    finally:
        os.close(top)
