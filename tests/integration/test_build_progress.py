"""A task image build says what it does while it does it: `opencode-env run --task DIR` prints podman build's own
`STEP n/m: ...` lines on stderr as `[image] ...` progress lines (not a RUN step's output), then the built image's
archive loaded into this machine's storage (its size, then its time), and the image unpacked into the local backend's
cache as the sandbox is made; a second run says the image is built already and unpacks nothing.
The build's output is streamed: a line reaches the callback while podman is still running."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from opencode_env.sandbox.local.images.build.box import BoxError, run_group
from opencode_env.sandbox.local.images.build.builder import TAG_REPOSITORY
from opencode_env.wire import RolloutResult
from tests.integration.test_harbor_rollout import _task_dir

pytestmark = pytest.mark.timeout(900)


async def _run_task(task: Path, sandbox_base: Path) -> tuple[RolloutResult, list[str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "opencode_env.cli",
        "run",
        "--task",
        str(task),
        "--oracle",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(sandbox_base)},
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()[-2000:]
    return RolloutResult.model_validate_json(stdout), stderr.decode().splitlines()


def _remove_image(result: RolloutResult) -> None:
    if result.task is not None and result.task.image.startswith(TAG_REPOSITORY):
        subprocess.run(["podman", "rmi", "--force", result.task.image], capture_output=True, timeout=120, check=False)


async def test_run_task_streams_the_builds_steps_and_the_archive_load(tmp_path: Path, sandbox_base: Path) -> None:
    task = _task_dir(tmp_path, f"progress-{uuid.uuid4().hex[:8]}", solution="sed -i 's/a - b/a + b/' /app/calc.py\n")
    (task / "environment" / "nonce.txt").write_text(uuid.uuid4().hex)  # a context never built before: a real build
    result, lines = await _run_task(task, sandbox_base)
    try:
        assert (result.status, result.reward) == ("completed", 1.0), result.error
        image = [line for line in lines if line.startswith("[image] ")]
        steps = [line for line in image if re.match(r"^\[image\] STEP \d+/\d+: ", line)]
        assert [step.split(":", 1)[0] for step in steps] == [f"[image] STEP {n}/4" for n in (1, 2, 3, 4)]
        assert steps[0].startswith("[image] STEP 1/4: FROM ")
        assert steps[3] == "[image] STEP 4/4: RUN python3 -c \"print('built in the image')\" > /app/built.txt"
        assert not any("built in the image" in line and "STEP" not in line for line in lines)
        load = next(i for i, line in enumerate(image) if line.startswith("[image] loading the built image"))
        assert re.fullmatch(
            r"\[image\] loading the built image into this machine's storage \(\d+\.\d MiB archive\)", image[load]
        )
        assert re.fullmatch(r"\[image\] loaded the built image in \d+\.\ds", image[load + 1])
        ref = re.escape(result.task.image if result.task else "")
        assert image[0] == f"[image] building {result.task.image if result.task else ''} from {task / 'environment'}"
        built = next(i for i, line in enumerate(image) if re.fullmatch(rf"\[image\] built {ref} in \d+\.\ds", line))
        assert image.index(steps[-1]) < load < built
        assert lines.index(image[built]) < next(i for i, line in enumerate(lines) if line.startswith("[sandbox] "))
        # The new image is unpacked into the local backend's cache as its first sandbox is made: said, with its size.
        assert re.fullmatch(
            rf"\[image\] unpacking {ref} \(\d+\.\d MiB\) into the image cache \(once per image\)", image[-2]
        )
        assert re.fullmatch(rf"\[image\] unpacked {ref} in \d+\.\ds", image[-1])
        assert lines.index(image[-2]) > next(i for i, line in enumerate(lines) if line.startswith("[sandbox] "))

        again, lines = await _run_task(task, sandbox_base)
        image = [line for line in lines if line.startswith("[image] ")]
        assert image == [
            f"[image] {again.task.image if again.task else ''} is built already (same context): nothing to build"
        ]
    finally:
        _remove_image(result)


def test_a_line_reaches_the_callback_while_the_process_still_runs(tmp_path: Path) -> None:
    """The process prints one line, then waits for a file that only the callback for that line creates: it ends only
    if its first line was handed over while it ran (read at the end, it would wait out the timeout)."""
    flag = tmp_path / "seen"
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "first":
            flag.touch()

    script = f"echo first; while [ ! -e {flag} ]; do sleep 0.05; done; echo second; echo oops >&2; exit 3"
    completed = run_group(["sh", "-c", script], 60, env={"PATH": "/usr/bin:/bin"}, what="waiting", on_line=on_line)
    assert (completed.returncode, completed.stdout, completed.stderr) == (3, "first\nsecond\n", "oops\n")
    assert sorted(seen) == ["first", "oops", "second"]


def test_a_callback_that_fails_does_not_stall_the_process(tmp_path: Path) -> None:
    def broken(line: str) -> None:
        raise OSError("stderr is closed")

    script = "i=0; while [ $i -lt 20000 ]; do echo line $i; i=$((i+1)); done"
    completed = run_group(["sh", "-c", script], 120, env={"PATH": "/usr/bin:/bin"}, what="printing", on_line=broken)
    assert completed.returncode == 0
    assert completed.stdout.count("\n") == 20000


def test_a_streamed_process_past_its_deadline_is_stopped_with_its_stderr(tmp_path: Path) -> None:
    with pytest.raises(BoxError, match="podman timed out after 1 s: started"):
        run_group(
            ["sh", "-c", "echo started >&2; exec sleep 60"],
            1,
            env={"PATH": "/usr/bin:/bin"},
            what="sleeping",
            on_line=print,
        )
