from __future__ import annotations

from dataclasses import dataclass

from opencode_env.models import RolloutResult
from opencode_env.rollout import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.testing.demo import demo_request
from opencode_env.testing.script import Script
from opencode_env.testing.scripted_model import Exchange, ScriptedModelServer


@dataclass
class Outcome:
    result: RolloutResult
    exchanges: list[Exchange]


async def rollout(backend: SandboxBackend, script: Script, **fields: object) -> Outcome:
    with ScriptedModelServer(script) as model:
        request = demo_request(model.base_url, **fields)
        result = await run_rollout(request, backend)
        return Outcome(result, list(model.exchanges))
