"""`-p tests.opencode_runs` (docs/development.md) counts the OpenCode runs each test starts in a sandbox: a rollout
on the local backend whose OpenCode is /bin/true is one run, charged to its test and its file, whether the test ran
in pytest's own process or in an xdist worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/integration/test_faults.py::test_opencode_exits_0_without_doing_anything"


@pytest.mark.parametrize("workers", ["0", "1"], ids=["in-process", "xdist-worker"])
def test_the_plugin_counts_a_rollouts_opencode_run_per_test_and_file(tmp_path: Path, workers: str) -> None:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-n",
        workers,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.opencode_runs",
    ]
    done = subprocess.run(
        [*command, f"--basetemp={tmp_path / 'pytest'}", TEST],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = done.stdout.split("real OpenCode runs", 1)[1].splitlines()
    assert f"  1  {TEST}" in summary
    assert "  1  total tests/integration/test_faults.py" in summary
    assert "  1  total" in summary
