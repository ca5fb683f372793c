"""The wheel as people install it: built with `uv build --package opencode-env` (its sdist, then the wheel from the
sdist, as a registry's user gets it), installed into a fresh virtualenv without the server
extra, its OpenCodeEnv calling a real server on loopback. The build and the virtualenv are offline; the install
takes the thin client's few dependencies from uv's cache where it can (`./dev setup` filled it), else from PyPI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from opencode_env.cli.app import build_parser
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from tests.stub_server import StubServer, stub_server

ROOT = Path(__file__).resolve().parents[2]
RESULT_V0 = ROOT / "tests" / "fixtures" / "result_v0_demo.json"
SERVER_ONLY = ["fastapi", "uvicorn", "fastmcp", "openenv", "e2b", "huggingface_hub", "starlette", "pyseccomp"]

CALLER = """
import asyncio, importlib.util, json, sys
from opencode_env import OpenCodeEnv, RolloutRequest, RolloutResult
from opencode_env.wire.answer import RolloutAnswer

async def main(url, model_url):
    request = RolloutRequest(instruction="x", base_url=model_url, model="scripted-policy", verify=["true"])
    async with OpenCodeEnv(base_url=url + "/mcp") as env:
        tools = [tool.name for tool in await env.list_tools()]
        result = await env.run_rollout(request)
    print(json.dumps({
        "tools": tools,
        "sandbox_id": result.sandbox_id,
        "is_result": isinstance(result, RolloutResult),
        "answer_schema": sorted(RolloutAnswer.model_json_schema()["properties"])[:3],
        "missing": [name for name in sys.argv[3:] if importlib.util.find_spec(name) is None],
    }))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def uv(*args: str | Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    command = shutil.which("uv")
    prefix = [command] if command else [sys.executable, "-m", "uv"]
    return subprocess.run(
        [*prefix, *map(str, args)], capture_output=True, text=True, timeout=timeout_s, check=True, cwd=ROOT
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel, and a fresh virtualenv with it installed (no extra)."""
    where = tmp_path_factory.mktemp("wheel")
    uv("build", "--package", "opencode-env", "--offline", "--out-dir", where / "dist")
    [wheel] = (where / "dist").glob("opencode_env-*.whl")
    venv = where / "venv"
    uv("venv", "--offline", "--python", sys.executable, venv)
    uv("pip", "install", "--python", venv / "bin" / "python", wheel)
    return wheel, venv


def test_the_wheel_installs_no_server_command(installed: tuple[Path, Path]) -> None:
    wheel, venv = installed
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [entry_points] = [name for name in names if name.endswith("entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    assert "\nserver =" not in scripts
    assert "opencode-env = " in scripts
    assert not (venv / "bin" / "server").exists()


def test_the_installed_client_calls_a_running_server_without_the_server_extra(installed: tuple[Path, Path]) -> None:
    _, venv = installed
    running: StubServer
    with ScriptedModelServer(demo_script()) as model, stub_server(command_s=0.01) as running:
        completed = subprocess.run(
            [venv / "bin" / "python", "-c", CALLER, running.url, model.base_url, *SERVER_ONLY],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=venv,
        )
    assert completed.returncode == 0, completed.stderr
    answer = json.loads(completed.stdout)
    assert answer["tools"] == ["run_rollout"]
    assert answer["is_result"]
    assert answer["sandbox_id"].startswith("stub")  # the rollout ran, on the server's (stub) backend
    assert answer["answer_schema"]
    assert answer["missing"] == SERVER_ONLY


def client_command(venv: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv / "bin" / "opencode-env", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


HELPS = """
import contextlib, io, json, sys
from opencode_env.__main__ import main

answers = {}
for command in json.loads(sys.argv[1]):
    sys.argv = ["opencode-env", *command.split(), "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main()
    answers[command] = out.getvalue()
print(json.dumps(answers))
"""


def test_every_command_s_help_runs_on_the_client_alone(installed: tuple[Path, Path]) -> None:
    _, venv = installed
    commands = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {"run", "serve", "view", "export", "eval"} <= set(commands)
    asked = [*commands, "image build-base"]
    completed = subprocess.run(
        [venv / "bin" / "python", "-c", HELPS, json.dumps(asked)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=venv,
    )
    assert completed.returncode == 0, completed.stderr
    answers = json.loads(completed.stdout)
    assert [command for command in asked if not answers[command].startswith("usage: opencode-env")] == []
    assert "server extra" not in completed.stderr


def test_the_result_readers_run_on_the_client_alone(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = installed
    viewed = client_command(venv, "view", RESULT_V0, "--out", tmp_path / "page.html", cwd=tmp_path)
    assert viewed.returncode == 0, viewed.stderr
    assert "<html" in (tmp_path / "page.html").read_text()[:200].lower()
    exported = client_command(
        venv, "export", RESULT_V0, "--format", "trl", "--out", tmp_path / "rows.jsonl", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    [row] = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert row["completion_ids"]
    listed = client_command(venv, "settings", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "OPENCODE_ENV_TOKEN" in listed.stdout


def test_commands_that_run_rollouts_here_say_what_to_install(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = installed
    for command in (
        ["run", "--model", "scripted", "--instruction", "x"],
        ["demo"],
        ["serve"],
        ["eval", "--out", "o", "t.json"],
    ):
        completed = client_command(venv, *command, cwd=tmp_path)
        assert completed.returncode == 2, (command, completed.stdout, completed.stderr)
        assert f"opencode-env {command[0]}: " in completed.stderr
        assert "pip install 'opencode-env[server]'" in completed.stderr
        assert "Traceback" not in completed.stderr


def test_the_examples_and_eval_call_a_server_from_the_client_alone(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, venv = installed
    python = venv / "bin" / "python"
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"instruction": "x", "verify": ["true"], "task_id": "t"}) + "\n")
    running: StubServer
    with ScriptedModelServer(demo_script()) as model, stub_server(command_s=0.01) as running:
        endpoint = ["--base-url", model.base_url, "--model", "scripted-policy"]
        quickstart = subprocess.run(
            [python, ROOT / "examples" / "quickstart.py", "--server", running.url, *endpoint],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=tmp_path,
        )
        evaluated = client_command(
            venv,
            "eval",
            "--server",
            running.url,
            *endpoint,
            "-k",
            "2",
            "--out",
            tmp_path / "out",
            tmp_path / "tasks.jsonl",
            cwd=tmp_path,
        )
    assert "Traceback" not in quickstart.stderr
    # the stub's agent exits without calling the model; its verify commands run nothing, so the reward file the demo's
    # verify declares (reward.txt) stays the host's empty one: 0.0, never the pass rate
    assert quickstart.stdout.startswith("agent_error 0.0 0\n"), quickstart.stdout
    assert "reward: no reward file written (reward.txt)" in quickstart.stdout
    assert evaluated.returncode == 0, evaluated.stderr
    assert sorted(path.name for path in (tmp_path / "out" / "results" / "t").glob("*.json")) == ["1.json", "2.json"]
    scripted = subprocess.run(
        [python, ROOT / "examples" / "quickstart.py", "--scripted"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert scripted.returncode != 0
    assert "pip install 'opencode-env[server]'" in scripted.stderr
    assert "Traceback" not in scripted.stderr
