"""A task's MCP servers (Harbor's `[environment] mcp_servers`) reach the agent through the real OpenCode on the local
backend: a remote server in a compose sidecar, by its service name; a stdio server is refused for an agent run
(wire/mcp.py's STDIO_REFUSED says why) and left unused by an oracle run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.services import ImageBuilder
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash
from opencode_env.tasks.harbor import TaskFormatError, request_from_task_dir
from opencode_env.wire.mcp import McpServer

CORPUS = Path(__file__).resolve().parents[1] / "harbor_corpus"
SCRIPTED = {"endpoint": "vllm", "model": "scripted-policy", "api_key": "sk-x"}


@pytest.mark.timeout(900)
async def test_harbors_hello_mcp_shape_the_agent_calls_the_sidecars_tool(backend: LocalBackend) -> None:
    """A compose sidecar declared as a streamable-http server by its service name (which OpenCode does not resolve:
    it is given 127.0.0.1), its tool called by the agent, its state graded by test.sh."""
    sign = ToolCallStep(name="mcp-server_sign_guestbook", arguments={"name": "harbor"})
    with ScriptedModelServer(Script(steps=[Step(tool_calls=[sign])]), any_model=True) as model:
        request = request_from_task_dir(CORPUS / "mcp-sidecar", base_url=model.base_url, **SCRIPTED)
        result = await run_rollout(request, backend)
        exchanges = list(model.exchanges)
    assert [service.name for service in request.services] == ["mcp-server"]
    assert (result.status, result.reward) == ("completed", 1.0), (result.error, result.verify_results)
    tools = [tool["function"]["name"] for tool in exchanges[0].request.get("tools", [])]
    assert "mcp-server_sign_guestbook" in tools, tools
    assert "signed by harbor (entry 1)" in json.dumps(exchanges[-1].request["messages"])
    assert not [notice for notice in result.notices if notice.code == "mcp_server_missing"]


@pytest.mark.timeout(900)
async def test_a_server_that_never_answers_leaves_the_agent_without_its_tools_and_says_it(
    backend: LocalBackend,
) -> None:
    with ScriptedModelServer(Script(steps=[bash("echo ran")]), any_model=True) as model:
        request = request_from_task_dir(CORPUS / "mcp-sidecar", base_url=model.base_url, **SCRIPTED)
        wrong_port = McpServer(name="mcp-server", transport="streamable-http", url="http://mcp-server:8001/mcp")
        result = await run_rollout(request.model_copy(update={"mcp_servers": [wrong_port]}), backend)
    assert (result.status, result.reward) == ("completed", 0.0), result.error
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
