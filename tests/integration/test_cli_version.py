"""`opencode-env --version`, as a real process: its own version and OpenCode's."""

from __future__ import annotations

import subprocess
import sys

from opencode_env.wire import OPENCODE_VERSION, VERSION


def test_the_cli_says_its_version_and_opencodes() -> None:
    command = [sys.executable, "-m", "opencode_env.cli", "--version"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"opencode-env {VERSION} (OpenCode {OPENCODE_VERSION})"
