"""Every ending of `opencode-env run` and `eval` as a user meets it: SIGTERM, SIGINT and SIGHUP sent to a real
`opencode-env` process while the real OpenCode agent is mid-turn against the scripted model. Each writes the partial
result (status cancelled, the phase it was in, the turns captured so far), exits 128 + the signal, prints one line and
no traceback, and leaves none of its sandbox's directories, mounts or processes behind."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash
from opencode_env.wire import RolloutResult
from tests.conftest import processes_mentioning

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def agent_sleep() -> str:
    """The agent's long command, this test's own: found by its argument, never another test's or another run's (a
    shared mark let a test signal its run when a neighbour's agent reached its sleep, before its own had a turn)."""
    return f"sleep 9137.{secrets.randbelow(10**9):09d}"


@pytest.fixture
def model(agent_sleep: str) -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(Script(steps=[bash(agent_sleep, "Wait")])) as server:
        yield server


def _environment(tmp_path: Path) -> dict[str, str]:
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    return {**os.environ, "TMPDIR": str(sandboxes), "PYTHONUNBUFFERED": "1"}


def _wait_for_line(process: subprocess.Popen[str], needle: str, seen: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"the process ended before printing {needle!r}: {''.join(seen)}")


def _wait_for_agent_command(process: subprocess.Popen[str], seen: list[str], agent_sleep: str) -> None:
    """Until the agent runs its command (OpenCode's start alone took minutes on this 2-core machine at load 30), or
    the process ends without it, which fails at once with what it printed; the test's own timeout bounds the wait."""
    while not processes_mentioning(agent_sleep, settle_s=0):
        if process.poll() is not None:
            assert process.stderr is not None
            printed = "".join(seen) + process.stderr.read()
            raise AssertionError(f"the process ended (exit {process.returncode}) before its agent's command: {printed}")
        time.sleep(0.2)


def _leftovers(tmp_path: Path, agent_sleep: str) -> list[str]:
    directories = [str(path) for path in (tmp_path / "tmp").iterdir()]
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in line]
    processes = processes_mentioning(str(tmp_path), agent_sleep)
    return directories + mounts + processes


@pytest.mark.parametrize(
    ("ending", "to_file"),
    [(signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGHUP, True)],
    ids=["SIGTERM-out", "SIGINT-stdout", "SIGHUP-out"],
)
def test_a_signalled_run_writes_its_partial_result_and_leaves_nothing(
    ending: signal.Signals, to_file: bool, model: ScriptedModelServer, agent_sleep: str, tmp_path: Path
) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "opencode_env.cli", "run", "--base-url", model.base_url]
    command += ["--model", "scripted-policy", "--instruction", "Wait a while.", "--agent-timeout", "700"]
    command += ["--out", str(out)] if to_file else []
    process = subprocess.Popen(
        command,
        env=_environment(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert process.stdout is not None
        stdout_read = pool.submit(process.stdout.read)
        try:
            _wait_for_line(process, "[agent]", seen)
            _wait_for_agent_command(process, seen, agent_sleep)
            process.send_signal(ending)
            assert process.stderr is not None
            rest = process.stderr.read()
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        stdout = stdout_read.result()
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()
    process.stderr.close()
    assert process.returncode == 128 + ending, rest
    assert "Traceback" not in rest
    assert "KeyboardInterrupt" not in rest
    [line] = [line for line in rest.splitlines() if line.startswith("opencode-env")]
    assert line.startswith(f"opencode-env run: ended by {ending.name} during agent; the sandbox is closed")
    assert line.endswith(f"partial result in {out}" if to_file else "partial result on stdout")
    result = RolloutResult.model_validate_json(out.read_text() if to_file else stdout)
    assert (result.status, result.failed_phase) == ("cancelled", "agent")
    assert result.error == f"the rollout was ended by {ending.name} during agent"
    assert result.proxy_turns, "the turns captured before the signal are in the result"
    assert _leftovers(tmp_path, agent_sleep) == []


def test_a_signalled_eval_keeps_the_cut_attempt_apart_and_leaves_nothing(
    model: ScriptedModelServer, agent_sleep: str, tmp_path: Path
) -> None:
    task = tmp_path / "wait.json"
    request = {"instruction": "Wait a while.", "task_id": "wait", "agent_timeout_s": 700}
    task.write_text(json.dumps({**request, "base_url": model.base_url, "model": "scripted-policy"}))
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "opencode_env.cli", "eval", str(task), "--out", str(out), "-k", "1"]
    process = subprocess.Popen(
        command, env=_environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seen: list[str] = []
    try:
        _wait_for_line(process, "attempts: 1 in all", seen)
        _wait_for_agent_command(process, seen, agent_sleep)
        process.terminate()
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, rest
    assert "Traceback" not in rest
    [line] = [line for line in rest.splitlines() if "ended by" in line]
    assert line.startswith("opencode-env eval: ended by SIGTERM; 0 attempt(s) saved")
    assert "1 cut short" in line
    cut = RolloutResult.model_validate_json((out / "results" / "wait" / "1.cancelled.json").read_text())
    assert (cut.status, cut.failed_phase, cut.task_id) == ("cancelled", "agent", "wait")
    assert cut.proxy_turns
    assert not (out / "results" / "wait" / "1.json").exists(), "a rerun runs the cut attempt again"
    assert _leftovers(tmp_path, agent_sleep) == []
