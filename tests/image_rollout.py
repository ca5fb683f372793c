"""The image's rollout smoke test, run inside the container by `./dev image` (`python -m tests.image_rollout`, with
tests/ mounted read-only for this test only, never part of the image).

One demo rollout through the server's standard MCP endpoint, with its token, on the Hugging Face backend as a Space
runs it. The SDK under the backend is the fake HF cloud (opencode_env.testing) in plain mode: the container plays the
sandbox's VM (the backend's real setpriv drops task commands to `user`; its proxy runs as root with the image's
packages; OpenCode is the image's own). Everything is loopback: the scripted model, this server, the proxy.

The server is configured as a Space operator would configure it: a caller may name a model on this machine only if
the operator allows it in OPENCODE_ENV_UPSTREAM_ALLOW (`./dev image` sets it to the scripted model's address,
127.0.0.1:8001); without it the token server refuses the loopback URL, as it must.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from pathlib import Path

import httpx
from fastmcp import Client

from opencode_env.sandbox.cloud.hf import HFBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.testing.fake_hf import FakeHfCloud
from opencode_env.wire import RolloutResult
from opencode_env.wire.answer import RolloutAnswer
from tests.server_app import app_for

EXPECTED_TURNS = 3
MODEL_PORT = 8001
USER_UID = 1000


def user_processes() -> list[str]:
    """What still runs as `user` (the sandbox is closed: nothing should)."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == USER_UID:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{entry.name} {command[:120]}")
        except FileNotFoundError:
            continue
    return left


def problems(result: RolloutResult) -> list[str]:
    found = []
    if result.status != "completed":
        found.append(f"status {result.status} ({result.error})")
    if result.reward != 1.0:
        found.append(f"reward {result.reward}")
    if len(result.proxy_turns) != EXPECTED_TURNS:
        found.append(f"{len(result.proxy_turns)} proxy turns, not {EXPECTED_TURNS}")
    for turn in result.proxy_turns:
        if not (turn.aligned and turn.completion_token_ids and turn.prompt_token_ids):
            found.append(f"turn {turn.turn}: token ids missing or not aligned ({turn.token_id_source})")
    return found


async def rollout(server_url: str, token: str) -> RolloutResult:
    with ScriptedModelServer(demo_script(), port=MODEL_PORT) as model:
        async with Client(f"{server_url}/mcp/stream", auth=token) as client:
            # Graded in the agent's box: a fake cloud of plain processes is one VM (this container), and the grader's
            # box is a second VM (tested on the fakes in tests/integration/test_grader_box_cloud.py).
            request = demo_request(model.base_url, verify_sandbox="same").model_dump(mode="json")
            answer = await client.call_tool("run_rollout", request)
    summary = RolloutAnswer.model_validate(answer.structured_content)
    if summary.result is not None:
        return summary.result
    # Over the inline bound: the whole result by reference, as any MCP client reads it.
    assert summary.result_ref is not None, summary
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http:
        fetched = await http.get(httpx.URL(server_url).join(summary.result_ref.url), timeout=60)
    fetched.raise_for_status()
    return RolloutResult.model_validate_json(fetched.content)


def main() -> int:
    if os.geteuid() != 0:
        print("rollout smoke test: must run as root, as a Hugging Face sandbox server does", file=sys.stderr)
        return 1
    if f"127.0.0.1:{MODEL_PORT}" not in os.environ.get("OPENCODE_ENV_UPSTREAM_ALLOW", ""):
        print(
            f"rollout smoke test: OPENCODE_ENV_UPSTREAM_ALLOW must allow the scripted model (127.0.0.1:{MODEL_PORT}),"
            " as an operator allows a model on the Space's own machine",
            file=sys.stderr,
        )
        return 1
    cloud = FakeHfCloud(plain_processes=True)
    backend = HFBackend(sandbox_class=cloud.sandbox_class(), token=cloud.token, image="opencode-env", max_sandboxes=1)
    token = secrets.token_urlsafe(24)
    server = ThreadedServer(app_for(backend, max_rollouts=1, token=token))
    server.start()
    started = time.monotonic()
    try:
        result = asyncio.run(rollout(server.url, token))
    finally:
        server.stop()
        cloud.kill_all()
    elapsed = time.monotonic() - started
    aligned = sum(turn.aligned for turn in result.proxy_turns)
    print(
        f"rollout on the hf backend ({result.sandbox_id}, OpenCode {result.opencode_version}) through MCP: "
        f"status {result.status}, reward {result.reward}, {len(result.proxy_turns)} proxy turns "
        f"({aligned} with aligned token ids), wall {result.wall_s:.1f} s ({elapsed:.1f} s with the MCP call)"
    )
    print(f"phases: {result.timings.model_dump(exclude_defaults=True)}")
    left = user_processes()
    if left:
        print(f"still running as user after the sandbox closed: {left}")
    found = problems(result)
    if found:
        print(f"rollout smoke test FAILED: {'; '.join(found)}")
        for command in result.verify_results:
            print(f"  verify {command.cmd[:80]!r}: exit {command.exit_code} {command.stderr[-400:]}")
        print(f"  agent exit {result.agent_exit_code}, log tail: {result.agent_log_tail[-1500:]}")
        print(f"  proxy log tail: {result.proxy_log_tail[-1500:]}")
        return 1
    print("rollout smoke test passed")
    return 0


sys.exit(main())
