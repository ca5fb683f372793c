"""The image's smoke test, run inside the container by `./dev image` (stdin to its python): the server answers
/health, then, once it is built, refuses an MCP call without the token and lists its tool through the standard MCP
endpoint with it."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import httpx
from fastmcp import Client

BASE = f"http://127.0.0.1:{os.environ.get('PORT', '8000')}"
TOKEN = os.environ["OPENCODE_ENV_TOKEN"]


async def main() -> int:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(base_url=BASE, timeout=5) as http:
        while True:
            try:
                health = await http.get("/health")
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        print(f"/health: {health.status_code} {health.text[:200]}")
        # /health answers from the first moment; other requests wait until the app is built (server.staged).
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        refused = await http.post("/mcp/stream", json=call, timeout=max(deadline - time.monotonic(), 5))
        print(f"MCP without the token: {refused.status_code}")
    async with Client(f"{BASE}/mcp/stream", auth=TOKEN) as client:
        tools = await client.list_tools()
    names = [tool.name for tool in tools]
    print(f"tools/list: {names}")
    ok = health.status_code == 200 and refused.status_code == 401 and "run_rollout" in names
    print("smoke test passed" if ok else "smoke test FAILED")
    return 0 if ok else 1


sys.exit(asyncio.run(main()))
