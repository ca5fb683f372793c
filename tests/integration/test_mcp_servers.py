"""A task's MCP servers (Harbor's `[environment] mcp_servers`) reach the agent through the real OpenCode on the local
backend: a remote server in a compose sidecar, by its service name; a stdio server is refused for an agent run
(wire/mcp.py's STDIO_REFUSED says why) and left unused by an oracle run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.services import ImageBuilder
from opencode_env.scripted.model import Exchange, ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash
from opencode_env.tasks.harbor import TaskFormatError, request_from_task_dir
from opencode_env.wire.mcp import McpServer
from opencode_env.wire.result import RolloutResult

CORPUS = Path(__file__).resolve().parents[1] / "harbor_corpus"
SCRIPTED = {"endpoint": "vllm", "model": "scripted-policy", "api_key": "sk-x"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("linger_s", [None, 2.0], ids=["as-written", "slow-close"])
async def test_harbors_hello_mcp_shape_the_agent_calls_the_sidecars_tool(
    backend: LocalBackend, tmp_path: Path, linger_s: float | None
) -> None:
    """A compose sidecar declared as a streamable-http server by its service name (which OpenCode does not resolve:
    it is given 127.0.0.1), its tool called by the agent, its state graded by test.sh. The server speaks HTTP/1.0
    (one request per connection); one that is slow to close a connection after answering (as a loaded machine makes
    any) still gets every request on a connection of its own."""
    task = CORPUS / "mcp-sidecar"
    if linger_s is not None:
        task = _with_server_args(task, tmp_path / "task", [str(linger_s)])
    sign = ToolCallStep(name="mcp-server_sign_guestbook", arguments={"name": "harbor"})
    with ScriptedModelServer(Script(steps=[Step(tool_calls=[sign])]), any_model=True) as model:
        request = request_from_task_dir(task, base_url=model.base_url, **SCRIPTED)
        result = await run_rollout(request, backend)
        exchanges = list(model.exchanges)
    tools = [tool["function"]["name"] for tool in exchanges[0].request.get("tools", [])] if exchanges else []
    evidence = _evidence(result, tools, exchanges)
    assert [service.name for service in request.services] == ["mcp-server"]
    assert (result.status, result.reward) == ("completed", 1.0), evidence
    assert "mcp-server_sign_guestbook" in tools, evidence
    assert "signed by harbor (entry 1)" in json.dumps(exchanges[-1].request["messages"]), evidence
    assert not [notice for notice in result.notices if notice.code == "mcp_server_missing"], evidence


def _with_server_args(task: Path, copy: Path, args: list[str]) -> Path:
    """A copy of the task whose MCP server's command takes `args`."""
    shutil.copytree(task, copy)
    compose = copy / "environment" / "docker-compose.yaml"
    command = '["python3", "/srv/server.py"]'
    text = compose.read_text()
    assert command in text
    compose.write_text(text.replace(command, json.dumps(["python3", "/srv/server.py", *args])))
    return copy


def _evidence(result: RolloutResult, tools: list[str], exchanges: list[Exchange]) -> str:
    """What a failed run saw, for its message: the tools the model was offered, what the tool call answered, the
    notices and OpenCode's log."""
    messages = [message for exchange in exchanges for message in exchange.request["messages"]]
    return json.dumps(
        {
            "status": result.status,
            "reward": result.reward,
            "error": result.error,
            "verify": [step.model_dump(mode="json") for step in result.verify_results],
            "notices": [f"{notice.code}: {notice.message}" for notice in result.notices],
            "tools_offered": tools,
            "model_calls": len(exchanges),
            "tool_answers": [message for message in messages if message["role"] == "tool"][-3:],
            "tool_calls": [call.model_dump(mode="json") for call in result.tool_calls],
            "agent_log_tail": result.agent_log_tail,
        },
        indent=1,
        default=str,
    )


@pytest.mark.timeout(900)
async def test_a_server_that_never_answers_leaves_the_agent_without_its_tools_and_no_reward(
    backend: LocalBackend,
) -> None:
    with ScriptedModelServer(Script(steps=[bash("echo ran")]), any_model=True) as model:
        request = request_from_task_dir(CORPUS / "mcp-sidecar", base_url=model.base_url, **SCRIPTED)
        wrong_port = McpServer(name="mcp-server", transport="streamable-http", url="http://mcp-server:8001/mcp")
        result = await run_rollout(request.model_copy(update={"mcp_servers": [wrong_port]}), backend)
    assert (result.status, result.reward, result.failed_phase) == ("sandbox_error", None, "agent"), result.error
    assert "mcp_servers.mcp-server: none of its tools reached the model" in (result.error or "")
    assert [notice.code for notice in result.notices if notice.code.startswith("mcp")] == ["mcp_server_missing"]
    assert any(warning.startswith("mcp_servers.mcp-server: none of its tools") for warning in result.warnings)


class _NoBuilds(ImageBuilder):
    """A builder that fails any build: the refusal comes before one."""

    def __init__(self) -> None:
        pass

    def build(self, *args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("built an image for a refused task")


def test_a_stdio_server_is_refused_for_the_agent_and_unused_by_the_oracle() -> None:
    """The agent's run of a stdio task is refused before any sandbox, naming the server and the way out; its oracle
    run (tests/integration/test_harbor_corpus.py) starts no OpenCode and needs none."""
    refused = r"mcp-codes/task\.toml: mcp_servers\.codes: stdio MCP servers are not supported yet.*sidecar"
    with pytest.raises(TaskFormatError, match=refused):
        request_from_task_dir(CORPUS / "mcp-codes", builder=_NoBuilds(), base_url="http://127.0.0.1:9/v1", **SCRIPTED)
    oracle = request_from_task_dir(CORPUS / "mcp-codes", oracle=True)
    assert [(server.name, server.transport) for server in oracle.mcp_servers] == [("codes", "stdio")]
