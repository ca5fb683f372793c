from __future__ import annotations

import secrets
from dataclasses import dataclass

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
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
