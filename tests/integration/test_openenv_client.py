"""OpenEnv's client conventions: `OpenEnvOpenCode` is openenv-core's `MCPToolClient` (code written against it drives
ours, against a real server on loopback with the stub backend), `from_docker_image` runs an image with the engine's
CLI and stops it on close (the engine here: an executable recording its argv, the server: the stub one at the port
it is given), and a Space is reached by its name."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

from opencode_env import OpenCodeEnv
from opencode_env.client.client import space_image, space_url
from opencode_env.client.container import LocalContainer, run_argv
from opencode_env.client.openenv import OpenEnvOpenCode
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import TOOL_NAME, RolloutRequest
from opencode_env.wire.answer import inline_result
from tests.stub_server import StubServer, stub_arguments, stub_server

SECRET = "s3cret-never-in-argv"


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    with stub_server(command_s=0.01) as running:
        yield running


async def drive(env: MCPToolClient) -> tuple[list[str], Any, Any]:
    """Code written against OpenEnv's MCPToolClient, knowing nothing of opencode-env."""
    await env.reset()
    names = [tool.name for tool in await env.list_tools()]
    data = await env.call_tool(TOOL_NAME, **stub_arguments("by-call-tool"))
    step = await env.step(CallToolAction(tool_name=TOOL_NAME, arguments=stub_arguments("by-step")))
    return names, data, step.observation.result


async def test_openenv_code_drives_ours_as_its_own_client(server: StubServer) -> None:
    async with OpenEnvOpenCode(base_url=server.url) as env:
        assert isinstance(env, MCPToolClient)
        names, data, stepped = await drive(env)
        result = await env.run_rollout(RolloutRequest.model_validate(stub_arguments("by-run-rollout")))
    assert names == [TOOL_NAME]
    assert inline_result(data).task_id == "by-call-tool"
    assert inline_result(stepped.get("data", stepped)).task_id == "by-step"
    assert (result.backend, result.task_id) == ("stub", "by-run-rollout")


def test_openenvs_sync_wrapper_works_on_ours(server: StubServer) -> None:
    with OpenEnvOpenCode(base_url=server.url + "/mcp").sync() as env:
        assert [tool.name for tool in env.list_tools()] == [TOOL_NAME]
        result = env.run_rollout(**stub_arguments("sync"))
    assert (result.backend, result.task_id) == ("stub", "sync")


def test_it_waits_a_rollouts_budget_not_openenvs_minute() -> None:
    assert OpenEnvOpenCode("http://127.0.0.1:9")._message_timeout > 60
    assert OpenEnvOpenCode("http://127.0.0.1:9", message_timeout_s=5)._message_timeout == 5


async def test_a_servers_token_is_sent_where_openenvs_own_client_is_refused() -> None:
    with stub_server(command_s=0.01, token=SECRET) as guarded:
        with pytest.raises(ConnectionError):
            async with MCPToolClient(base_url=guarded.url) as bare:
                await bare.list_tools()
        async with OpenEnvOpenCode(base_url=guarded.url, token=SECRET) as env:
            assert [tool.name for tool in await env.list_tools()] == [TOOL_NAME]


@pytest.fixture
def engine(tmp_path: Path) -> tuple[Path, Path]:
    """An executable standing in for podman: it records each call (argv and the token it was given) and answers as
    the engine does (`run -d` prints the container's id)."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "podman"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as log:\n"
        "    log.write(json.dumps({'argv': sys.argv[1:], 'token': os.environ.get('OPENCODE_ENV_TOKEN')}) + '\\n')\n"
        "print('c0ffee' if sys.argv[1] == 'run' else sys.argv[-1])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def assert_ran_and_stopped(log: Path, port: int) -> None:
    run, stop = calls(log)
    assert run["argv"][:4] == ["run", "-d", "--rm", "--name"]
    assert run["argv"][run["argv"].index("-p") + 1] == f"127.0.0.1:{port}:8000"
    assert run["argv"][-1] == "ghcr.io/example/opencode-env:latest"
    assert run["argv"][run["argv"].index("-e") : run["argv"].index("-e") + 2] == ["-e", "OPENCODE_ENV_TOKEN"]
    assert not any(SECRET in argument for call in calls(log) for argument in call["argv"])
    assert run["token"] == SECRET
    assert stop["argv"][0] == "stop"
    assert stop["argv"][-1] == "c0ffee"


async def test_from_docker_image_runs_the_image_and_stops_it_on_close(
    server: StubServer, engine: tuple[Path, Path]
) -> None:
    script, log = engine
    port = int(server.url.rsplit(":", 1)[1])
    env = await OpenCodeEnv.from_docker_image(
        "ghcr.io/example/opencode-env:latest", engine=str(script), port=port, env_vars={"OPENCODE_ENV_TOKEN": SECRET}
    )
    async with env:
        assert env.base_url == f"http://127.0.0.1:{port}"
        assert [tool.name for tool in await env.list_tools()] == [TOOL_NAME]
        assert len(calls(log)) == 1
    assert_ran_and_stopped(log, port)


async def test_openenvs_from_docker_image_takes_our_container_as_its_provider(
    server: StubServer, engine: tuple[Path, Path]
) -> None:
    script, log = engine
    port = int(server.url.rsplit(":", 1)[1])
    env = await OpenEnvOpenCode.from_docker_image(
        "ghcr.io/example/opencode-env:latest",
        provider=LocalContainer(str(script)),
        port=port,
        env_vars={"OPENCODE_ENV_TOKEN": SECRET},
    )
    async with env:
        assert [tool.name for tool in await env.list_tools()] == [TOOL_NAME]
    assert_ran_and_stopped(log, port)


async def test_an_image_the_engine_cannot_run_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    failing = tmp_path / "docker"
    failing.write_text("#!/bin/sh\necho 'Error: no such image' >&2\nexit 125\n")
    failing.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"docker could not start missing:latest \(exit 125\): Error: no such image"):
        await OpenCodeEnv.from_docker_image("missing:latest", engine=str(failing))


async def test_an_option_for_an_image_is_refused_before_the_engine_runs(engine: tuple[Path, Path]) -> None:
    script, log = engine
    with pytest.raises(ValueError, match="image: an image reference"):
        await OpenCodeEnv.from_docker_image("--privileged", engine=str(script))
    assert not log.exists()


@given(image=st.text(min_size=1, max_size=40), names=st.lists(st.text(min_size=1, max_size=12), max_size=3))
def test_no_image_or_variable_name_becomes_an_option_of_the_engine(image: str, names: list[str]) -> None:
    """Whatever a caller passes, the argv is ours: the image is one last element that is no option, each variable one
    `-e NAME` with a plain name; anything else is a ValueError naming the field."""
    plain = not image.startswith("-") and not any(c.isspace() for c in image)
    if not (plain and all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable) for variable in names)):
        with pytest.raises(ValueError, match=r"^(image|env_vars): "):
            run_argv("podman", image, name="n", port=1, env_names=names)
        return
    argv = run_argv("podman", image, name="n", port=1, env_names=names)
    variables = [part for variable in names for part in ("-e", variable)]
    assert argv == ["podman", "run", "-d", "--rm", "--name", "n", "-p", "127.0.0.1:1:8000", *variables, image]


async def test_from_env_runs_the_spaces_image_from_its_registry(server: StubServer, engine: tuple[Path, Path]) -> None:
    script, log = engine
    port = int(server.url.rsplit(":", 1)[1])
    async with await OpenCodeEnv.from_env("Owner/My_Space", engine=str(script), port=port) as env:
        assert [tool.name for tool in await env.list_tools()] == [TOOL_NAME]
    assert calls(log)[0]["argv"][-1] == "registry.hf.space/owner-my-space:latest"
    with pytest.raises(ValueError, match="tag: an image tag"):
        space_image("owner/space", "latest --privileged")


def test_no_engine_on_path_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="none of podman, docker is on PATH"):
        LocalContainer()


NAME_PART = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)


@given(owner=NAME_PART, name=NAME_PART)
def test_a_space_by_its_name_is_its_hf_space_host(owner: str, name: str) -> None:
    url = space_url(f"{owner}/{name}")
    host = url.removeprefix("https://")
    assert host.endswith(".hf.space")
    assert host == host.lower()
    assert set(host.removesuffix(".hf.space")) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert OpenCodeEnv.from_hub(f"{owner}/{name}").base_url == url
    assert OpenEnvOpenCode.from_hub(f"{owner}/{name}").base_url == url


@pytest.mark.parametrize(
    "bad", ["", "space", "owner/", "/space", "a/b/c", "https://x.hf.space", "owner/sp ace", "owner/@evil.com", "../x"]
)
def test_what_is_no_space_name_is_refused_naming_the_form(bad: str) -> None:
    with pytest.raises(ValueError, match="repo_id: a Space's name as owner/space"):
        space_url(bad)


def test_the_known_space_url() -> None:
    assert space_url("Open_Env/opencode.env") == "https://open-env-opencode-env.hf.space"


def test_without_openenv_core_the_import_names_the_install_and_the_plain_client_works() -> None:
    probe = (
        "import sys\n"
        "sys.modules['openenv'] = None\n"
        "from opencode_env import OpenCodeEnv\n"
        "print(OpenCodeEnv.from_hub('owner/space').base_url)\n"
        "try:\n"
        "    import opencode_env.client.openenv\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    url, message = completed.stdout.splitlines()
    assert url == "https://owner-space.hf.space"
    assert "needs openenv-core: pip install 'opencode-env[server]'" in message


async def test_a_container_whose_client_cannot_be_made_is_stopped(
    server: StubServer, engine: tuple[Path, Path]
) -> None:
    script, log = engine
    port = int(server.url.rsplit(":", 1)[1])
    with pytest.raises(TypeError, match="unexpected keyword argument 'tokn'"):
        await OpenCodeEnv.from_docker_image("img", engine=str(script), port=port, tokn="x")
    assert [call["argv"][0] for call in calls(log)] == ["run", "stop"]


async def test_pointed_at_a_model_server_it_says_it_is_one() -> None:
    lists = r"is a model server \(OpenAI-compatible: its /models lists"
    with ScriptedModelServer(demo_script()) as model, pytest.raises(ConnectionError, match=lists):
        async with OpenEnvOpenCode(base_url=model.base_url) as env:
            await env.list_tools()
