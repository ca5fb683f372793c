from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from opencode_env.opencode import cached_tools, install_cached
from opencode_env.sandbox.local import LocalBackend


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    return install_cached()


@pytest.fixture(scope="session")
def sandbox_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandboxes")


@pytest.fixture(scope="session")
def backend(opencode_binary: Path, sandbox_base: Path) -> LocalBackend:
    return LocalBackend(cached_tools, base_dir=sandbox_base)


def processes_mentioning(text: str) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if text in line and "ps -eo" not in line]


@pytest.fixture
def no_leaks(sandbox_base: Path) -> Iterator[None]:
    """After the test: no sandbox directory and no process of any sandbox is left behind."""
    yield
    assert list(sandbox_base.iterdir()) == []
    assert processes_mentioning(str(sandbox_base)) == []
