"""The capture proxy's compartment reaches its package and its private directories wherever the host keeps them,
behind any number of 0700 directories (`mktemp -d`, pytest's base directory, /root), and shows nothing else of the
host outside its system directories: the directories leading to what it binds are made in its own tmpfs and opened
up there, while a directory bound from the host keeps its host mode, which the proxy's unprivileged uid cannot
cross."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opencode_env
from opencode_env.sandbox.base import ProvidedTools
from opencode_env.sandbox.local.isolation.bubblewrap import Layout, proxy_argv
from opencode_env.sandbox.local.isolation.host_ids import HostIds
from opencode_env.sandbox.local.isolation.host_view import runtime_paths

IDS = HostIds(root=2000123456)
PLACES = ("/tmp", "/", "/var", os.path.expanduser("~"))
"""Where a rollout's tree may lie: a temporary place, a top-level directory of the operator's, a system place that
is not a system directory, the operator's home."""


@contextmanager
def locked_directories(place: str, depth: int) -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="opencode-env-compartment-", dir=place))
    try:
        inner = top
        for level in range(depth - 1):
            inner = inner / f"level{level}"
            inner.mkdir(mode=0o700)
        yield inner
    finally:
        shutil.rmtree(top)


def run_in_compartment(layout: Layout, bound: list[str], script: str) -> subprocess.CompletedProcess[str]:
    argv = proxy_argv(layout, IDS, bound, ["sh", "-c", script])
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def make_private(directory: Path) -> None:
    directory.mkdir(mode=0o700)
    os.chown(directory, IDS.root, IDS.root)


@contextmanager
def rollout_layout(rollouts: Path) -> Iterator[Layout]:
    """A rollout's root with its private directory, and its sockets directory where the backend makes it."""
    layout = Layout(rollouts / f"rollout-{os.getpid()}-{secrets.token_hex(4)}")
    layout.root.mkdir(mode=0o700)
    make_private(layout.private)
    layout.sockets.parent.mkdir(parents=True, exist_ok=True)
    make_private(layout.sockets)
    try:
        yield layout
    finally:
        shutil.rmtree(layout.sockets)


@settings(max_examples=12, deadline=None)
@given(place=st.sampled_from(PLACES), depth=st.integers(min_value=1, max_value=3), same_tree=st.booleans())
def test_the_proxy_reaches_its_package_and_private_directories_and_nothing_beside_them(
    place: str, depth: int, same_tree: bool
) -> None:
    with locked_directories(place, depth) as rollouts, locked_directories(place, depth) as checkout:
        package = (rollouts if same_tree else checkout) / "package"
        package.mkdir()
        (package / "module.py").write_text("reached\n")
        beside = package.parent / "secret.txt"
        beside.write_text("the operator's\n")
        with rollout_layout(rollouts) as layout:
            script = (
                f"cat {package}/module.py && echo written > {layout.private}/trace.jsonl"
                f" && echo bound > {layout.sockets}/admin && ls {layout.root} && cat {beside}"
            )
            ran = run_in_compartment(layout, [str(package)], script)
            assert ran.stdout.splitlines() == ["reached", "private"], ran
            assert "No such file" in ran.stderr, ran
            assert (layout.private / "trace.jsonl").read_text() == "written\n"
            assert (layout.sockets / "admin").read_text() == "bound\n"


def test_the_proxy_is_given_its_package_not_the_directory_above_it() -> None:
    package = Path(opencode_env.__file__).resolve().parent
    paths = runtime_paths(ProvidedTools(python=sys.executable))
    assert str(package) in paths
    assert str(package.parent) not in paths or str(package.parent) in (sys.prefix, sys.base_prefix)


@pytest.mark.parametrize("place", PLACES)
def test_a_directory_bound_whole_keeps_its_host_mode(place: str) -> None:
    """The other half of the rule: bind the 0700 checkout itself and the proxy's uid is locked out of it."""
    with locked_directories(place, 1) as checkout:
        (checkout / "package").mkdir()
        (checkout / "package" / "module.py").write_text("reached\n")
        with rollout_layout(checkout) as layout:
            ran = run_in_compartment(layout, [str(checkout)], f"cat {checkout}/package/module.py")
        assert (ran.returncode, "Permission denied" in ran.stderr) == (1, True), ran
