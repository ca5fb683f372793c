"""Task images build offline, and where it matters it says so: a typical Harbor Dockerfile (`RUN pip install
requests`) fails in the real box with the build's own error followed by what to do, and `check-task` warns about
the step before it builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.images.build.hints import OFFLINE_HINT, network_steps, offline_hint
from tests.integration.test_harbor_task import make_task

pytestmark = pytest.mark.timeout(900)


def test_a_pip_install_step_fails_with_the_offline_hint_and_check_task_warns_first(tmp_path: Path) -> None:
    dockerfile = f"FROM {build_base_image()}\nRUN pip install requests  # {os.getpid()}-{os.urandom(3).hex()}\n"
    task = make_task(
        tmp_path, f"offline-{os.getpid()}", environment={"Dockerfile": dockerfile}, solution={"solve.sh": "true\n"}
    )
    argv = [sys.executable, "-m", "opencode_env.cli", "check-task", str(task)]
    checked = subprocess.run(argv, capture_output=True, text=True, timeout=800, check=False)
    assert checked.returncode == 2, checked.stderr
    warned, _, built = checked.stderr.partition("[image] building")
    assert "warning: environment/Dockerfile line 2 needs the network? RUN pip install requests" in warned
    assert "exit status 1" in built
    assert f"\n  {OFFLINE_HINT}" in built


def test_the_hint_follows_a_name_resolution_failure_only() -> None:
    failed = "podman build exited 1: ... Failed to establish a new connection: [Errno -3] Temporary failure in name"
    assert offline_hint(failed + " resolution").endswith(OFFLINE_HINT)
    assert offline_hint("podman build exited 1: exit status 2") == "podman build exited 1: exit status 2"


def test_network_steps_names_installs_downloads_and_clones_across_continuation_lines() -> None:
    dockerfile = (
        "FROM x\n# RUN pip install commented\nRUN apt-get update && \\\n    apt-get install -y git\n"
        "ADD https://example.com/a.tgz /a\nCOPY . /app\nRUN python -m pip install -r req.txt\nRUN make\n"
    )
    assert [number for number, _ in network_steps(dockerfile)] == [3, 4, 5, 7]
