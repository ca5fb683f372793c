from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import HOME, WORKDIR, SandboxBackend
from opencode_env.sandbox.local.backend import LocalSandbox
from opencode_env.testing.demo import demo_request
from opencode_env.testing.script import Script
from opencode_env.testing.scripted_model import Exchange, ScriptedModelServer
from opencode_env.wire import RolloutResult

RUN_MARK = f"{secrets.randbelow(10**6):06d}"
"""Fractional digits that make this test run's sleeping commands its own: a leak check looks for them across the
machine and never mistakes another run's processes (another pytest, an xdist worker, a server) for a leak."""


def sleep_cmd(seconds: int) -> str:
    return f"sleep {seconds}.{RUN_MARK}"


@dataclass
class Outcome:
    result: RolloutResult
    exchanges: list[Exchange]


async def rollout(backend: SandboxBackend, script: Script, **fields: object) -> Outcome:
    with ScriptedModelServer(script) as model:
        request = demo_request(model.base_url, **fields)
        result = await run_rollout(request, backend)
        return Outcome(result, list(model.exchanges))


def host_path(sandbox: LocalSandbox, path: str) -> Path:
    """Where a path in a local sandbox's home or /tmp lives on the host, from the sandbox's public layout: for tests
    and the fakes that emulate a cloud VM with a local sandbox. Where the product reads or writes a sandbox's tree it
    goes through hostfs (no link followed); a test that opens this path must not stand in for that."""
    normal = os.path.normpath(path if path.startswith("/") else f"{WORKDIR}/{path}")
    if normal == HOME or normal.startswith(HOME + "/"):
        return sandbox.layout.home / os.path.relpath(normal, HOME)
    if normal == "/tmp" or normal.startswith("/tmp/"):
        return sandbox.layout.tmp / os.path.relpath(normal, "/tmp")
    raise ValueError(f"{path!r} is outside the sandbox's home and /tmp")
