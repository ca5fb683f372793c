from __future__ import annotations

import functools
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from opencode_env.rollout.endpoints import resolve_upstream
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import probe_endpoint
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import Exchange, ScriptedModelServer
from opencode_env.scripted.script import Script, demo_script
from opencode_env.settings import Settings
from opencode_env.wire import RolloutRequest, RolloutResult

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


@functools.cache
def idle_model_url() -> str:
    """A model server for rollouts that never reach their agent's model (stub sandboxes, cloud fakes that fail
    first): the endpoint probe refuses a URL nobody listens on before any sandbox, and this one answers it. One per
    test process, its thread a daemon's. It answers any model name: the tests' requests name what they like."""
    return ScriptedModelServer(demo_script(), any_model=True).__enter__().base_url


async def gone_after_its_probe(**fields: object) -> RolloutRequest:
    """The demo request toward a model server that answered the endpoint probe (cached) and then went away: what a
    model server that dies mid-run looks like to the rollout, whose agent's calls then find nobody listening."""
    with ScriptedModelServer(demo_script()) as model:
        request = demo_request(model.base_url, **fields)
        # As the rollout probes (its token-in check is part of the cached probe's key), so its probe is this one.
        await probe_endpoint(
            resolve_upstream(request, Settings.load()),
            top_logprobs=request.top_logprobs,
            token_in=request.token_in != "off",
        )
    return request


def beside_a_loop(loop: Callable[[], None], work: Callable[[int], None], count: int, workers: int) -> None:
    """`work` over range(count) on `workers` threads while `loop` runs again and again in a thread of its own (a
    reaper, a pruner), stopped and joined however the work ends."""
    stop = threading.Event()

    def again() -> None:
        while not stop.is_set():
            loop()

    looping = threading.Thread(target=again)
    looping.start()
    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, range(count)))
    finally:
        stop.set()
        looping.join()
