"""The unit tier starts no process: each test runs with process creation refused, so a test that needs one fails
here, naming what it started, and belongs in a later tier (tests/conftest.py's TIERS)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import pytest


class ProcessStarted(AssertionError):
    """A unit test started a process."""


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ProcessStarted(f"a unit test started a process ({what} {str(args[:1])[:120]}): move it to a later tier")

    return refused


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("subprocess.Popen"))
    monkeypatch.setattr(os, "fork", _refuse("os.fork"))
    monkeypatch.setattr(os, "posix_spawn", _refuse("os.posix_spawn"))
    monkeypatch.setattr(os, "posix_spawnp", _refuse("os.posix_spawnp"))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", _refuse("asyncio.create_subprocess_exec"))
    monkeypatch.setattr(asyncio, "create_subprocess_shell", _refuse("asyncio.create_subprocess_shell"))
