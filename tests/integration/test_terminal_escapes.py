"""Task-supplied text reaches the operator's terminal escaped: a Dockerfile whose bytes clear the screen and set the
window title prints them as escapes in the build progress and in the build's error (a real build in the box, through
the real CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.cli.terminal import escape_controls
from tests.integration.test_harbor_task import make_task
from tests.integration.test_images import busybox_image  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(900)
CLEAR_AND_TITLE = "\x1b[2J\x1b[H\x1b]0;pwned\x07\x9b31m\u202e"


def test_a_dockerfile_that_clears_the_screen_prints_escaped(tmp_path: Path, busybox_image: str) -> None:  # noqa: F811
    dockerfile = f"FROM {busybox_image}\nRUN echo '{CLEAR_AND_TITLE}' {os.getpid()} && false\n"
    task = make_task(
        tmp_path, f"escapes-{os.getpid()}", environment={"Dockerfile": dockerfile}, solution={"solve.sh": "true\n"}
    )
    argv = [sys.executable, "-m", "opencode_env.cli", "check-task", str(task)]
    checked = subprocess.run(argv, capture_output=True, timeout=800, check=False)
    shown = checked.stderr.decode("utf-8", errors="surrogateescape")
    assert checked.returncode == 2, shown
    assert "[image] STEP 2/2: RUN echo '\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07\\x9b31m\\u202e'" in shown
    assert "building" in shown
    assert shown.count("\\x1b[2J") >= 2, "the step's line and the build's error both name it"
    assert not any(character in shown for character in "\x1b\x07\x9b\u202e")


def test_escape_controls_keeps_text_and_escapes_every_control() -> None:
    assert escape_controls("a\tb\nc é ✓") == "a\tb\nc é ✓"
    assert escape_controls("\r\x00\x7f\x85\u2066") == "\\x0d\\x00\\x7f\\x85\\u2066"
