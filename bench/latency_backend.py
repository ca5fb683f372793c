"""A sandbox backend that runs no processes: every call answers after the delay a real sandbox would take, and the
agent leaves what a real one does (a written file, OpenCode's events, a capture proxy trace with logprobs).

For load benches of the server and the pipeline around the agent, in transparent_proxy mode: the proxy is started,
polled for health, drained and its trace read and parsed, as in a real rollout, so the result a caller receives
carries turns of a realistic size (prompt ids, completion ids, logprobs, top logprobs).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opencode_env.rollout.attribution import SESSION_HEADER
from opencode_env.rollout.state import EVENTS_PATH
from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    OPENCODE_DATA_DIR,
    WORKDIR,
    Identity,
    OpenSandboxes,
    Preflight,
    ProvidedTools,
    ProxyLaunch,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
)
from opencode_env.testing.stub_backend import MemoryFiles, StubBackend, StubProcess
from opencode_env.wire import CommandResult, LimitHit


@dataclass(frozen=True)
class Latencies:
    """Seconds each kind of call takes; a (low, high) pair is drawn uniformly per call."""

    create: tuple[float, float] = (0.8, 1.2)
    command: tuple[float, float] = (0.05, 0.5)
    agent: tuple[float, float] = (3.0, 5.0)
    file: tuple[float, float] = (0.005, 0.015)
    proxy_start: tuple[float, float] = (0.2, 0.4)
    close: tuple[float, float] = (0.1, 0.3)


@dataclass(frozen=True)
class TraceShape:
    """The agent's model calls as the capture proxy records them."""

    turns: int = 4
    first_prompt_tokens: int = 6000
    tool_output_tokens: int = 300
    completion_tokens: int = 150
    top_logprobs: int = 5


SESSION = "ses_latency"


def synthetic_trace(shape: TraceShape, seed: int) -> bytes:
    """Trace lines in the capture proxy's format: each prompt continues the previous turn's prompt and completion
    (compacted with prompt_base, as the proxy writes it)."""
    rng = random.Random(seed)
    lines, previous_length = [], 0
    for turn in range(shape.turns):
        if turn == 0:
            prompt_base, new_ids = None, [rng.randrange(150_000) for _ in range(shape.first_prompt_tokens)]
        else:
            prompt_base = {"turn": turn - 1, "count": previous_length}
            new_ids = [rng.randrange(150_000) for _ in range(shape.tool_output_tokens)]
        completion_ids = [rng.randrange(150_000) for _ in range(shape.completion_tokens)]
        prompt_length = (previous_length if turn else 0) + len(new_ids)
        previous_length = prompt_length + len(completion_ids)
        record = {
            "type": "turn",
            "turn": turn,
            "finish_reason": "tool_calls" if turn < shape.turns - 1 else "stop",
            "upstream_status": 200,
            "latency_s": 0.8,
            "completion_tokens": [f"t{token_id}" for token_id in completion_ids],
            "completion_token_ids": completion_ids,
            "per_token_logps": [-rng.random() for _ in completion_ids],
            "top_logprobs": [
                [[f"t{token_id + k}", -rng.random() * (k + 1), token_id + k] for k in range(shape.top_logprobs)]
                for token_id in completion_ids
            ],
            "usage": {"prompt_tokens": prompt_length, "completion_tokens": len(completion_ids)},
            "token_id_source": "return_token_ids",
            "aligned": True,
            "prompt_base": prompt_base,
            "prompt_token_ids": new_ids,
            # OpenCode's own calls name its session (a call without one is unattributed and never trained).
            "headers": {SESSION_HEADER: SESSION},
        }
        lines.append(json.dumps(record))
    return ("\n".join(lines) + "\n").encode()


def opencode_events(turns: int) -> bytes:
    """OpenCode's `--format json` events for an agent that wrote a file and ran a check."""
    events: list[dict[str, Any]] = []
    for step in range(turns):
        if step < turns - 1:
            tool = "write" if step == 0 else "bash"
            state = {"status": "completed", "title": f"{tool} step {step}", "metadata": {"exit": 0}}
            events.append({"type": "tool_use", "part": {"tool": tool, "state": state}})
        else:
            events.append({"type": "text", "part": {"text": "Done: add.py is written and checked."}})
        events.append({"type": "step_finish", "part": {"tokens": {"input": 6000, "output": 150}}})
    return ("\n".join(json.dumps(event) for event in events) + "\n").encode()


@dataclass(frozen=True)
class AgentRecord:
    """What the agent leaves behind, made once per backend (making it is the bench's work, not the server's)."""

    turns: int
    trace: bytes
    events: bytes

    @classmethod
    def of(cls, shape: TraceShape) -> AgentRecord:
        return cls(shape.turns, synthetic_trace(shape, seed=0), opencode_events(shape.turns))


class LatencyProxy:
    """A capture proxy that is healthy after a moment and holds the trace the agent's calls would have written."""

    base_url = "http://127.0.0.1:9/v1"
    token = "latency"
    status_interval_s = 1.0

    def __init__(self, sandbox: LatencySandbox) -> None:
        self._sandbox = sandbox
        self._alive = True

    async def running(self) -> bool:
        return self._alive

    async def kill(self) -> None:
        self._alive = False

    async def call(self, path: str, method: str, wait_s: float) -> dict[str, Any] | None:
        await self._sandbox.pause("file")
        return {"ok": True, "turns_written": self._sandbox.turns_written}

    async def read(self, name: str, limit: int) -> bytes:
        await self._sandbox.pause("file")
        return self._sandbox.proxy_files.get(name, b"")[-limit:]


class LatencySandbox(MemoryFiles):
    backend = "latency"
    enforcement: dict[str, str] = {}  # noqa: RUF012 - read-only, shared by every sandbox
    opencode_data_dir = OPENCODE_DATA_DIR
    opencode_isolated = False

    def __init__(
        self, sandbox_id: str, latencies: Latencies, left_behind: AgentRecord, seed: int, registry: OpenSandboxes
    ) -> None:
        self.sandbox_id = sandbox_id
        self._registry = registry
        self.tools = ProvidedTools(opencode="opencode", opencode_version="latency", python="python3", proxy_ready=True)
        self.files: dict[str, bytes] = {}
        self.proxy_files: dict[str, bytes] = {"proxy.log": b"proxy listening\n"}
        self.turns_written = 0
        self._latencies = latencies
        self._left_behind = left_behind
        self._rng = random.Random(seed)

    async def pause(self, kind: str) -> None:
        low, high = getattr(self._latencies, kind)
        await asyncio.sleep(self._rng.uniform(low, high))

    async def run(
        self,
        cmd: str,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKDIR,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        keep_background: bool = False,
        identity: Identity = "user",
    ) -> CommandResult:
        is_agent = env is not None and "OPENCODE_CONFIG" in env
        low, high = self._latencies.agent if is_agent else self._latencies.command
        duration = self._rng.uniform(low, high)
        if duration > timeout_s:
            await asyncio.sleep(timeout_s)
            return CommandResult(cmd=cmd, exit_code=None, duration_s=timeout_s, timed_out=True)
        await asyncio.sleep(duration)
        if is_agent:
            self._act_as_agent()
        return CommandResult(cmd=cmd, exit_code=0, stdout="ok\n", duration_s=round(duration, 4))

    def _act_as_agent(self) -> None:
        self.files[f"{WORKDIR}/add.py"] = b"def add(a, b):\n    return a + b\n"
        self.files[EVENTS_PATH] = self._left_behind.events
        self.proxy_files["trace.jsonl"] = self._left_behind.trace
        self.turns_written = self._left_behind.turns

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> StubProcess:
        await self.pause("file")
        return StubProcess()

    async def start_proxy(self, launch: ProxyLaunch) -> LatencyProxy:
        await self.pause("proxy_start")
        return LatencyProxy(self)

    def limits_hit(self) -> list[LimitHit]:
        return []

    async def close(self) -> None:
        self._registry.discard(self)
        await self.pause("close")


class LatencyBackend:
    name = "latency"
    capabilities = StubBackend.capabilities

    async def preflight(self) -> Preflight:
        return self.preflight_verdict()

    def preflight_verdict(self) -> Preflight:
        return Preflight()

    def __init__(self, latencies: Latencies | None = None, shape: TraceShape | None = None) -> None:
        self._latencies = latencies or Latencies()
        self._left_behind = AgentRecord.of(shape or TraceShape())
        self._ids = itertools.count(1)
        self._open = OpenSandboxes()
        self.created = 0

    async def create(self, spec: SandboxSpec) -> LatencySandbox:
        number = next(self._ids)
        sandbox = LatencySandbox(f"latency{number}", self._latencies, self._left_behind, number, self._open)
        await sandbox.pause("create")
        self._open.add(sandbox)
        self.created += 1
        return sandbox

    async def close_all(self) -> int:
        return await self._open.close_all()


def as_backend(backend: LatencyBackend) -> SandboxBackend:
    """The fake seen through the seam it stands in for (mypy checks that it still fits the Protocol)."""
    return backend


def as_sandbox(sandbox: LatencySandbox) -> Sandbox:
    return sandbox
