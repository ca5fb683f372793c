"""`model="scripted"`: a newcomer's rollout with no model server and no key, from Python, the CLI (the built-in
behaviour, --script FILE, a Harbor task's solve.sh played by the agent) and a server over plain HTTP (the curl
form), none of them with VLLM_URL set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.script import Script, bash
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.answer import inline_result
from tests.integration.test_harbor_rollout import _task_dir
from tests.server_app import app_for

pytestmark = pytest.mark.timeout(900)
NO_MODEL_VARIABLES = {name: value for name, value in os.environ.items() if not name.startswith(("VLLM_", "OPENAI_"))}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_env.cli", "run", *args],
        env=NO_MODEL_VARIABLES,
        capture_output=True,
        text=True,
        check=False,
        timeout=850,
    )


async def test_in_process_with_the_builtin_scripted_model(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_URL", raising=False)
    request = RolloutRequest(model="scripted", instruction="Look around.", verify=["test -d /home/user/workdir"])
    result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert result.upstream.model == "scripted"
    assert len(result.proxy_turns) == 2
    assert result.tool_calls[0].tool == "bash"
    assert result.verify_results[0].exit_code == 0


def test_the_cli_plays_a_script_file(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(Script(steps=[bash("echo scripted > mine.txt", "Write")]).model_dump_json())
    out = tmp_path / "result.json"
    ran = _run("--model", "scripted", "--script", str(script), "--instruction", "Write mine.txt", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    assert "the scripted model plays 1 step(s)" in ran.stderr
    result = RolloutResult.model_validate_json(out.read_text())
    assert result.files["mine.txt"] == "scripted\n"
    bad = _run("--model", "scripted", "--script", str(tmp_path / "nope.json"), "--instruction", "x")
    assert bad.returncode == 2
    assert "argument --script: cannot read" in bad.stderr


def test_the_cli_plays_a_harbor_tasks_solution_through_the_agent(tmp_path: Path) -> None:
    task = _task_dir(tmp_path, "fix-calc", solution="sed -i 's/a - b/a + b/' /app/calc.py\n")
    out = tmp_path / "result.json"
    ran = _run("--task", str(task), "--model", "scripted", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    result = RolloutResult.model_validate_json(out.read_text())
    assert (result.status, result.reward, result.oracle) == ("completed", 1.0, False)
    assert result.proxy_turns, "the agent ran the solution through the capture proxy"


def test_the_curl_form_on_a_server_without_a_model(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_URL", raising=False)
    server = ThreadedServer(app_for(backend))
    server.start()
    try:
        arguments = {"model": "scripted", "instruction": "Create hello.py that prints hello", "verify": ["true"]}
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "run_rollout", "arguments": arguments},
        }
        answer = httpx.post(
            f"{server.url}/mcp",
            json=call,
            headers={"accept": "application/json, text/event-stream"},
            timeout=800,
        )
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    # The answer is JSON or one server-sent event, as the accept header allows either.
    events = [line.removeprefix("data:") for line in answer.text.splitlines() if line.startswith("data:")]
    data = json.loads(events[-1]) if events else answer.json()
    result = inline_result(data["result"]["structuredContent"])
    assert result.status == "completed", result.error
    assert len(result.proxy_turns) == 2
