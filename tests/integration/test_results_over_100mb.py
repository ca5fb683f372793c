"""A result over 100 MB reaches `OpenCodeEnv` and OpenEnv's `MCPToolClient` whole, every token id, where a /ws frame
of it used to be refused ("1009 message too big": OpenEnv's clients take 100 MB messages): the session answers with
a small `RolloutAnswer` and the result travels by reference, gzip'd, over the server's result route.

The stand-in answers with a recorded result of 52k sampled tokens (top-5 alternatives) and 107 MiB of base64 agent
text beside them (random bytes: its gzip stream is ~85 MB, no smaller than a real result's would be)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from openenv.core.mcp_client import MCPToolClient
from websockets.asyncio.client import connect

from opencode_env.client.by_reference import fetch_result
from opencode_env.client.client import OpenCodeEnv
from opencode_env.wire import RolloutResult
from tests.integration.test_results_at_size import TOKENS, SizedRollouts, arguments, assert_whole, sized_result
from tests.stand_in import stand_in_server

FRAME_LIMIT = 100 * 2**20
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def huge() -> RolloutResult:
    result = sized_result(TOKENS)
    result.agent_final_text = base64.b64encode(os.urandom(80 * 2**20)).decode()
    return result


@pytest.fixture(scope="module")
def url(huge: RolloutResult) -> Iterator[str]:
    with stand_in_server(SizedRollouts(huge)) as served:
        yield served


def assert_huge(result: RolloutResult, huge: RolloutResult) -> None:
    assert_whole(result, huge)
    assert result.agent_final_text == huge.agent_final_text


async def test_the_result_is_over_the_frame_limit_and_the_ws_frame_is_small(url: str) -> None:
    """What the session sends: one small frame, the result by reference (its JSON over 100 MB)."""
    async with connect(url.replace("http", "ws", 1) + "/ws", max_size=FRAME_LIMIT, proxy=None) as ws:
        action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments()}
        await ws.send(json.dumps({"type": "step", "data": action}))
        frame = await ws.recv()
    data: dict[str, Any] = json.loads(frame)["data"]["observation"]["result"]["data"]
    ref = data["result_ref"]
    assert ref["json_bytes"] > FRAME_LIMIT
    assert data["result"] is None
    assert len(frame) < 64 * 1024


async def test_opencode_env_gets_a_result_over_100_mb_whole(url: str, huge: RolloutResult) -> None:
    async with OpenCodeEnv(url) as env:
        result = await env.run_rollout(**arguments())
    assert_huge(result, huge)


async def test_openenv_mcp_tool_client_gets_a_result_over_100_mb_whole(url: str, huge: RolloutResult) -> None:
    async with MCPToolClient(base_url=url, message_timeout_s=600) as env:
        answer = await env.call_tool("run_rollout", **arguments())
    assert_huge(await fetch_result(url, answer), huge)
