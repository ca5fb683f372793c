"""Bytes on the wire per sampled token, on every path a caller gets a rollout's whole result by: the real server
(`server.app`'s app, every transport) on loopback, its rollouts a stand-in that answers with one recorded result
(`bench.wire_format.sampled`: vLLM's shape, float32 logprobs, top-5 alternatives named by text, the sampled token
among them), each path taken the way its client takes it, and the bytes its client received counted (HTTP bodies
as sent, gzip'd where they are; WebSocket frames as sent: the server negotiates no compression).

    uv run --frozen python -m bench.answer_paths [--tokens 100000]

Side by side: what `/ws` sent before this round (the whole result three times in one frame, uncompressed), computed
from the same result the way the server built that frame.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect

from bench.wire_format import sampled
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.app import create_app
from opencode_env.server.rollouts import Progress, Rollouts
from opencode_env.server.runtime import Runtime
from opencode_env.server.tool import build_mcp
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest, RolloutResult

STREAM = {"accept": "application/json, text/event-stream"}
ARGUMENTS = {"instruction": "x", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
GOAL_B_PER_TOKEN = 64


class Recorded(Rollouts):
    def __init__(self, result: RolloutResult) -> None:
        super().__init__(StubBackend(command_s=0), 4)
        self.result = result

    async def run(self, request: RolloutRequest, progress: Progress | None = None, **_: Any) -> RolloutResult:
        return self.result


def _call(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def _sse_json(body: bytes) -> dict[str, Any]:
    text = body.decode()
    data = next(line[5:] for line in text.split("\n") if line.startswith("data:")) if "data:" in text else text
    answer: dict[str, Any] = json.loads(data)
    return answer


async def _route(http: httpx.AsyncClient, path: str) -> int:
    response = await http.get(path, headers={"accept-encoding": "gzip"})
    response.raise_for_status()
    return response.num_bytes_downloaded


async def standard_mcp(http: httpx.AsyncClient) -> tuple[int, int]:
    response = await http.post(
        "/mcp", json=_call("tools/call", {"name": "run_rollout", "arguments": ARGUMENTS}), headers=STREAM
    )
    ref = _sse_json(response.content)["result"]["structuredContent"]["result_ref"]
    return response.num_bytes_downloaded, await _route(http, ref["path"])


async def standard_mcp_resources(http: httpx.AsyncClient) -> tuple[int, int]:
    response = await http.post(
        "/mcp", json=_call("tools/call", {"name": "run_rollout", "arguments": ARGUMENTS}), headers=STREAM
    )
    ref = _sse_json(response.content)["result"]["structuredContent"]["result_ref"]
    parts = 0
    stream = b""
    for uri in ref["resources"]:
        part = await http.post("/mcp", json=_call("resources/read", {"uri": uri}), headers=STREAM)
        parts += part.num_bytes_downloaded
        stream += base64.b64decode(_sse_json(part.content)["result"]["contents"][0]["blob"])
    assert len(stream) == ref["gzip_bytes"]
    return response.num_bytes_downloaded, parts


async def openenv_json_rpc(http: httpx.AsyncClient) -> tuple[int, int]:
    response = await http.post("/mcp", json=_call("tools/call", {"name": "run_rollout", "arguments": ARGUMENTS}))
    ref = response.json()["result"]["structured_content"]["result_ref"]
    return response.num_bytes_downloaded, await _route(http, ref["path"])


async def websocket(http: httpx.AsyncClient) -> tuple[int, int]:
    url = str(http.base_url).replace("http", "ws", 1).rstrip("/") + "/ws"
    async with connect(url, max_size=None, proxy=None) as ws:
        action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": ARGUMENTS}
        await ws.send(json.dumps({"type": "step", "data": action}))
        frame = await ws.recv()
    raw = frame.encode() if isinstance(frame, str) else frame
    ref = json.loads(raw)["data"]["observation"]["result"]["data"]["result_ref"]
    return len(raw), await _route(http, ref["path"])


async def step(http: httpx.AsyncClient) -> tuple[int, int]:
    action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": ARGUMENTS}
    response = await http.post("/step", json={"action": action})
    ref = response.json()["observation"]["result"]["data"]["result_ref"]
    return response.num_bytes_downloaded, await _route(http, ref["path"])


def old_websocket_frame(result: RolloutResult) -> int:
    """The frame /ws sent for this result before: the result as `data`, as `structured_content`, and as the JSON
    text of the text block, in OpenEnv's observation envelope."""
    data = orjson.loads(result.model_dump_json())
    observed = {
        "content": [{"type": "text", "text": orjson.dumps(data).decode(), "annotations": None, "meta": None}],
        "structured_content": data,
        "meta": {},
        "data": data,
        "is_error": False,
    }
    message = {"type": "observation", "data": {"observation": {"result": observed}, "reward": None, "done": False}}
    return len(json.dumps(message))


PATHS = {
    "/mcp streamable + GET /results (gzip)": standard_mcp,
    "/mcp streamable + resources/read": standard_mcp_resources,
    "/mcp OpenEnv JSON-RPC + GET /results": openenv_json_rpc,
    "/ws (OpenCodeEnv, MCPToolClient) + GET": websocket,
    "/step + GET /results": step,
}


async def measure(url: str, tokens: int) -> dict[str, tuple[int, int]]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        return {name: await path(http) for name, path in PATHS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--float64", action="store_true", help="float64 logprobs (the scripted model's default)")
    args = parser.parse_args()
    result = sampled(args.tokens, by_text=True, float32=not args.float64)
    tokens = sum(len(turn.completion_token_ids) for turn in result.proxy_turns)
    runtime = Runtime.build(backend=StubBackend(command_s=0), keep_results=False)
    runtime.rollouts = Recorded(result)
    runtime.mcp = build_mcp(runtime.rollouts, runtime.results)
    server = ThreadedServer(create_app(runtime))
    server.start()
    try:
        measured = asyncio.run(measure(server.url, tokens))
    finally:
        server.stop()
    json_bytes = len(result.model_dump_json())
    width = "float64" if args.float64 else "float32"
    print(f"{tokens:,} sampled tokens, top-5 by text, {width}; the result's JSON {json_bytes / tokens:.1f} B/token")
    print(f"{'path':<42} {'answer B':>10} {'result B':>12} {'B/token':>8}  vs before")
    before = old_websocket_frame(result)
    print(f"{'/ws before (whole result x3, one frame)':<42} {before:>10,} {0:>12,} {before / tokens:>8.1f}  1.00x")
    for name, (answer, body) in measured.items():
        per_token = (answer + body) / tokens
        mark = "" if per_token <= GOAL_B_PER_TOKEN else f"  over the {GOAL_B_PER_TOKEN} B goal"
        print(f"{name:<42} {answer:>10,} {body:>12,} {per_token:>8.1f}  {per_token * tokens / before:.2f}x{mark}")


if __name__ == "__main__":
    main()
