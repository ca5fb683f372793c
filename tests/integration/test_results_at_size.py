"""A result of 50k+ sampled tokens with top-5 alternatives reaches every client whole, at the clients' defaults:
the MCP SDK's streamable HTTP client and fastmcp's Client (answer + resources/read of its parts, or the linked
route), OpenEnv's MCPToolClient (WebSocket and production JSON-RPC), OpenCodeEnv, plain HTTP (curl's way).

The servers, transports and clients are real; the rollout is a stand-in (`SizedRollouts`) that answers at once with
a result of that size, so that these tests test the answer's path, not the agent."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import random
import shutil
import subprocess
from array import array
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from fastmcp import Client as FastMCPClient
from mcp.client.client import Client as SdkClient
from openenv.core.mcp_client import MCPToolClient

from opencode_env.client.client import OpenCodeEnv
from opencode_env.server.rollouts import Progress, Rollouts
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest, RolloutResult, RolloutTurn
from opencode_env.wire.answer import INLINE_MAX_BYTES, RolloutAnswer
from tests.integration.test_mcp_clients import INSPECTOR_PACKAGE, run_inspector
from tests.stand_in import stand_in_server

TOKENS = 52_000


def sized_result(tokens: int, per_turn: int = 2_000, seed: int = 3) -> RolloutResult:
    rng = random.Random(seed)
    turns = []
    for number in range(-(-tokens // per_turn)):
        count = min(per_turn, tokens - number * per_turn)
        ids = [int(150_000 ** rng.random()) for _ in range(count)]
        logprobs = array("f", [-rng.expovariate(2.0) for _ in range(count)]).tolist()
        top = [
            [(f"<{i}>", lp, i), *[(f"<{a}>", lp - 1.0 - j, a) for j, a in enumerate(rng.sample(range(3000), 4))]]
            for i, lp in zip(ids, logprobs, strict=True)
        ]
        turns.append(
            RolloutTurn(
                turn=number,
                completion_token_ids=ids,
                completion_tokens=[f"<{i}>" for i in ids],
                per_token_logps=logprobs,
                top_logprobs=top,
                prompt_token_ids=list(range(100 + number)),
            )
        )
    return RolloutResult(task_id="sized", backend="stub", status="completed", reward=1.0, proxy_turns=turns)


class SizedRollouts(Rollouts):
    def __init__(self, result: RolloutResult) -> None:
        super().__init__(StubBackend(command_s=0), 4)
        self.result = result

    async def run(self, request: RolloutRequest, progress: Progress | None = None, *, record: Any = None) -> Any:
        return self.result.model_copy(update={"task_id": request.task_id or "sized"})


@pytest.fixture(scope="module")
def expected() -> RolloutResult:
    return sized_result(TOKENS)


@pytest.fixture(scope="module")
def url(expected: RolloutResult) -> Iterator[str]:
    with stand_in_server(SizedRollouts(expected)) as served:
        yield served


def arguments(task_id: str = "sized") -> dict[str, Any]:
    return {"instruction": "x", "base_url": "http://127.0.0.1:9/v1", "model": "m", "task_id": task_id}


def assert_whole(data: Any, expected: RolloutResult) -> None:
    result = data if isinstance(data, RolloutResult) else RolloutResult.model_validate(data)
    assert sum(len(t.completion_token_ids) for t in result.proxy_turns) == TOKENS
    for got, want in zip(result.proxy_turns, expected.proxy_turns, strict=True):
        assert got.completion_token_ids == want.completion_token_ids
        assert array("d", got.per_token_logps).tobytes() == array("d", want.per_token_logps).tobytes()
        assert got.top_logprobs == want.top_logprobs
        assert got.completion_tokens == want.completion_tokens


def answer_of(structured: Any) -> RolloutAnswer:
    answer = RolloutAnswer.model_validate(structured)
    assert answer.result is None, "a result this size is by reference only"
    assert answer.result_ref is not None
    assert len(json.dumps(structured)) < INLINE_MAX_BYTES
    assert (answer.status, answer.reward, answer.sampled_tokens) == ("completed", 1.0, TOKENS)
    return answer


async def fetched(answer: RolloutAnswer, base_url: str) -> bytes:
    """The linked route (its URL is relative when the server could not know how it was reached)."""
    ref = answer.result_ref
    assert ref is not None
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.get(httpx.URL(base_url).join(ref.url))
    response.raise_for_status()
    assert response.headers["content-encoding"] == "gzip"
    assert hashlib.sha256(response.content).hexdigest() == ref.sha256
    return response.content


def test_the_result_is_megabytes_as_version_3_json(expected: RolloutResult) -> None:
    """The size the answer by reference exists for: the MCP SDK and fastmcp refuse events above 1 MiB by default."""
    assert len(expected.model_dump_json(context={"unpacked_tokens": True})) > 8 * 1024 * 1024


async def test_the_mcp_sdk_at_its_defaults_gets_the_answer_then_the_whole_result_by_resources(
    url: str, expected: RolloutResult
) -> None:
    async with SdkClient(f"{url}/mcp") as client:
        answer = answer_of((await client.call_tool("run_rollout", arguments())).structured_content)
        assert answer.result_ref is not None
        stream = b""
        for uri in answer.result_ref.resources:
            (part,) = (await client.read_resource(uri)).contents
            stream += base64.b64decode(part.blob)  # type: ignore[union-attr]
    assert_whole(orjson.loads(gzip.decompress(stream)), expected)
    assert_whole(orjson.loads(await fetched(answer, url)), expected)


async def test_fastmcp_at_its_defaults_gets_the_answer_then_the_whole_result(url: str, expected: RolloutResult) -> None:
    async with FastMCPClient(f"{url}/mcp") as client:
        called = await client.call_tool("run_rollout", arguments())
        answer = answer_of(called.structured_content)
        assert answer.result_ref is not None
        links = [block.uri for block in called.content if block.type == "resource_link"]
        assert str(links[0]) == answer.result_ref.url
        parts = [(await client.read_resource(uri))[0] for uri in answer.result_ref.resources]
    stream = b"".join(base64.b64decode(part.blob) for part in parts)  # type: ignore[union-attr]
    assert_whole(orjson.loads(gzip.decompress(stream)), expected)


async def test_openenv_clients_over_the_websocket_and_json_rpc_get_it_whole(url: str, expected: RolloutResult) -> None:
    async with MCPToolClient(base_url=url, message_timeout_s=120) as env:
        assert_whole(await env.call_tool("run_rollout", **arguments()), expected)
    production = MCPToolClient(base_url=url, message_timeout_s=120)
    production.use_production_mode = True
    async with production:
        data = await production.call_tool("run_rollout", **arguments())
    answer = answer_of(data)
    assert_whole(orjson.loads(await fetched(answer, url)), expected)


async def test_plain_http_json_rpc_and_the_route_without_gzip_get_it(url: str, expected: RolloutResult) -> None:
    """curl's way: one tools/call with the streamable headers, then the linked route, asked for plain JSON."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "run_rollout", "arguments": arguments()},
    }
    headers = {"accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(f"{url}/mcp", json=message, headers=headers)
        body = response.text
        payload = json.loads(body.split("data: ", 1)[1]) if body.startswith(("event:", "data:")) else json.loads(body)
        answer = answer_of(payload["result"]["structuredContent"])
        assert answer.result_ref is not None
        plain = await http.get(answer.result_ref.url, headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert_whole(orjson.loads(plain.content), expected)


async def test_opencode_env_gets_it_whole(url: str, expected: RolloutResult) -> None:
    async with OpenCodeEnv(url) as env:
        result = await env.run_rollout(**arguments())
    assert_whole(result, expected)


async def test_a_result_is_read_only_with_the_token_and_its_own_id() -> None:
    """The route follows the tool's access rule, and an id is a capability: no token, a wrong token, a made-up or
    truncated id, a path trick: each is refused; the caller's own id with the token reads its result."""
    token = "result-route-token"
    with stand_in_server(SizedRollouts(sized_result(10)), token) as served:
        bearer = {"authorization": f"Bearer {token}"}
        async with FastMCPClient(f"{served}/mcp", auth=token) as client:
            called = await client.call_tool("run_rollout", arguments())
        answer = RolloutAnswer.model_validate(called.structured_content)
        assert answer.result is not None, "a small result is also inline"
        assert answer.result_ref is not None
        ref = answer.result_ref
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await http.get(ref.url)).status_code == 401
            assert (await http.get(ref.url, headers={"authorization": "Bearer wrong"})).status_code == 401
            for forged in (ref.id[:-1] + ("A" if ref.id[-1] != "A" else "B"), ref.id[:20], "..%2F..%2Fetc%2Fpasswd"):
                assert (await http.get(f"{served}/results/{forged}", headers=bearer)).status_code == 404
            own = await http.get(ref.url, headers=bearer)
        assert own.status_code == 200
        assert_same(RolloutResult.model_validate_json(own.content), answer.result)


def assert_same(got: RolloutResult, want: RolloutResult) -> None:
    assert got.proxy_turns == want.proxy_turns


@pytest.mark.skipif(shutil.which("npx") is None or shutil.which("curl") is None, reason="needs Node's npx and curl")
@pytest.mark.timeout(600)
def test_mcp_inspector_cli_gets_the_answer_and_curl_the_whole_result(url: str, expected: RolloutResult) -> None:
    tool_arguments = " ".join(f"--tool-arg {name}={value}" for name, value in arguments("inspector").items())
    command = f"mcp-inspector --cli {url}/mcp --transport http --method tools/call --tool-name run_rollout "
    completed = run_inspector([INSPECTOR_PACKAGE], command + tool_arguments)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    answer = answer_of(json.loads(completed.stdout)["structuredContent"])
    assert answer.result_ref is not None
    fetched = subprocess.run(
        ["curl", "-sf", "--compressed", answer.result_ref.url], capture_output=True, timeout=120, check=True
    )
    assert hashlib.sha256(fetched.stdout).hexdigest() == answer.result_ref.sha256
    assert_whole(orjson.loads(fetched.stdout), expected)
