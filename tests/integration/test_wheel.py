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

from opencode_env.testing.script import demo_script
from opencode_env.testing.scripted_model import ScriptedModelServer
from tests.stub_server import StubServer, stub_server

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_command_line_without_the_server_extra_says_what_to_install(installed: tuple[Path, Path]) -> None:
    _, venv = installed
    completed = subprocess.run(
        [venv / "bin" / "opencode-env", "run", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 2
    assert "pip install 'opencode-env[server]'" in completed.stderr
