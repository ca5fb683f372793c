"""The capture proxy's life inside one sandbox: upload, start, wait for health, drain, read the trace."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from opencode_env.endpoints import Upstream
from opencode_env.models import RolloutRequest, RolloutTurn
from opencode_env.opencode import UPSTREAM_KEY_VAR
from opencode_env.sandbox.base import LOGS_DIR, ROLLOUT_DIR, BackgroundProcess, Sandbox
from opencode_env.sandbox.output import tail_text
from opencode_env.trace_records import ToolsRecord, TurnRecord

PACKAGE_DIR = f"{ROLLOUT_DIR}/pkg"
TRACE_PATH = f"{LOGS_DIR}/proxy/trace.jsonl"
LOG_PATH = f"{LOGS_DIR}/proxy/proxy.log"
PORT_FILE = f"{ROLLOUT_DIR}/proxy.port"
HEALTH_WAIT_S = 20.0
DRAIN_WAIT_S = 15.0


class ProxyStartError(Exception):
    """The capture proxy did not come up; the message carries its log."""


@dataclass
class RunningProxy:
    process: BackgroundProcess
    python: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def proxy_sources() -> dict[str, str]:
    """The proxy package's files, uploaded as they are next to an empty `opencode_env` package."""
    here = Path(__file__).parent / "proxy"
    files = {f"opencode_env/proxy/{path.name}": path.read_text() for path in sorted(here.glob("*.py"))}
    files["opencode_env/__init__.py"] = ""
    return files


def _proxy_command(python: str, upstream: Upstream, request: RolloutRequest) -> str:
    args = [
        python,
        "-m",
        "opencode_env.proxy",
        "--upstream-url",
        upstream.base_url,
        "--port",
        "0",
        "--port-file",
        PORT_FILE,
        "--trace",
        TRACE_PATH,
        "--top-logprobs",
        str(request.top_logprobs),
        "--max-tokens-cap",
        str(request.max_tokens_cap),
        "--model-override",
        upstream.model,
        "--endpoint-kind",
        upstream.endpoint,
        "--idle-timeout",
        str(request.upstream_idle_timeout_s),
        "--api-key-env",
        UPSTREAM_KEY_VAR,
    ]
    if upstream.disable_thinking:
        args.append("--disable-thinking")
    return shlex.join(args)


async def start_proxy(sandbox: Sandbox, upstream: Upstream, request: RolloutRequest, budget_s: float) -> RunningProxy:
    """Upload and start the proxy; returns once it listens (its port is known), before it is fully up."""
    python = sandbox.tools.python or "python3"
    for path, text in proxy_sources().items():
        await sandbox.write_file(f"{PACKAGE_DIR}/{path}", text)
    await sandbox.write_file(TRACE_PATH, b"")
    env = {UPSTREAM_KEY_VAR: upstream.api_key, "PYTHONPATH": PACKAGE_DIR, "PYTHONDONTWRITEBYTECODE": "1"}
    process = await sandbox.start(_proxy_command(python, upstream, request), log_path=LOG_PATH, env=env)
    deadline = time.monotonic() + min(budget_s, HEALTH_WAIT_S)
    port: int | None = None
    while port is None:
        if not await process.running():
            raise ProxyStartError(f"the capture proxy exited at start: {await proxy_log_tail(sandbox)}")
        if time.monotonic() > deadline:
            await process.kill()
            raise ProxyStartError(f"the capture proxy did not listen in time: {await proxy_log_tail(sandbox)}")
        try:
            port = int((await sandbox.read_file(PORT_FILE)).decode())
        except (FileNotFoundError, ValueError):
            await asyncio.sleep(0.02)
    return RunningProxy(process, python, port)


async def wait_healthy(sandbox: Sandbox, proxy: RunningProxy, budget_s: float) -> None:
    """Raise ProxyStartError unless the proxy answers /healthz within the budget."""
    answer = await _call(sandbox, proxy, "/healthz", "GET", min(budget_s, HEALTH_WAIT_S))
    if answer is None or answer.get("ok") is not True:
        await proxy.process.kill()
        raise ProxyStartError(f"the capture proxy did not answer /healthz: {await proxy_log_tail(sandbox)}")


async def _call(sandbox: Sandbox, proxy: RunningProxy, path: str, method: str, wait_s: float) -> dict[str, Any] | None:
    command = shlex.join(
        [
            proxy.python,
            "-m",
            "opencode_env.proxy.ping",
            f"http://127.0.0.1:{proxy.port}{path}",
            "--method",
            method,
            "--wait",
            f"{wait_s:.1f}",
        ]
    )
    result = await sandbox.run(command, timeout_s=wait_s + 5, env={"PYTHONPATH": PACKAGE_DIR})
    if result.exit_code != 0:
        return None
    answer = json.loads(result.stdout)
    return answer if isinstance(answer, dict) else None


async def stop_proxy(sandbox: Sandbox, proxy: RunningProxy) -> None:
    """Wait for the records still being written, then stop the proxy."""
    if await proxy.process.running():
        await _call(sandbox, proxy, "/drain", "POST", DRAIN_WAIT_S)
    await proxy.process.kill()


_TRACE_LINE: TypeAdapter[ToolsRecord | TurnRecord] = TypeAdapter(
    Annotated[ToolsRecord | TurnRecord, Field(discriminator="type")]
)


@dataclass
class Trace:
    turns: list[RolloutTurn] = field(default_factory=list)
    tools: dict[str, list[Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_trace(text: str) -> Trace:
    """Turns and tool schemas from the proxy's JSONL trace, with compacted prompt ids expanded.

    Strict: a line with an unknown key, type or outcome is left out and named in `problems`.
    """
    trace = Trace()
    sequences: dict[int, list[int]] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = _TRACE_LINE.validate_json(line)
            if isinstance(record, ToolsRecord):
                trace.tools[record.sha256] = record.tools
                continue
            prompt = record.prompt_token_ids
            if record.prompt_base is not None:
                base = record.prompt_base
                if base.count > len(sequences[base.turn]):
                    raise ValueError(f"prompt_base.count {base.count} is over turn {base.turn}'s ids")
                prompt = sequences[base.turn][: base.count] + prompt
            turn = RolloutTurn.model_validate(record.turn_fields(prompt))
            sequences[turn.turn] = turn.prompt_token_ids + turn.completion_token_ids
            trace.turns.append(turn)
        except KeyError as error:
            trace.problems.append(f"trace line {number}: prompt_base.turn {error} is not an earlier turn")
        except (ValueError, ValidationError) as error:
            trace.problems.append(f"trace line {number}: {error}")
    trace.turns.sort(key=lambda turn: turn.turn)
    return trace


async def read_trace(sandbox: Sandbox) -> Trace:
    try:
        return parse_trace((await sandbox.read_file(TRACE_PATH)).decode("utf-8", errors="replace"))
    except FileNotFoundError:
        return Trace()


async def proxy_log_tail(sandbox: Sandbox, limit: int = 8192) -> str:
    try:
        return tail_text(await sandbox.read_file(LOG_PATH), limit)
    except FileNotFoundError:
        return ""
