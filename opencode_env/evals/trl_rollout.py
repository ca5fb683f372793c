"""A TRL GRPOTrainer `rollout_func` that runs OpenCode rollouts on a runner (wire/runner.py): `OpenCodeEnv` (a
server), `InProcess` (a backend in this process) or `RayRollouts` (a Ray cluster).

    rollout_func = make_rollout_func(OpenCodeEnv(base_url=url), lambda prompt: RolloutRequest(...))
    trainer = GRPOTrainer(..., rollout_func=rollout_func, reward_funcs=[rollout_reward])

TRL (1.16.0) calls `rollout_func(prompts, trainer)` synchronously with each prompt already repeated
`num_generations` times, so the default is one rollout per prompt given; `rollouts_per_prompt` > 1 is for callers
that pass each prompt once. Rows come back in the prompts' order (see training/formats.py for the contract).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any

from opencode_env.training.formats import trl_batch
from opencode_env.wire import RolloutRequest, RolloutResult, Runner


def _run_sync(work: Callable[[], Awaitable[list[RolloutResult]]]) -> list[RolloutResult]:
    async def main() -> list[RolloutResult]:
        return await work()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Called from inside a running loop (a notebook): run ours in a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


def _filler_token_id(trainer: Any) -> int:
    eos = getattr(trainer, "eos_token_ids", None)
    return int(eos[0]) if eos else 0


def make_rollout_func(
    runner: Runner,
    to_request: Callable[[Any], RolloutRequest],
    *,
    rollouts_per_prompt: int = 1,
    max_concurrency: int | None = None,
    filler_token_id: int | None = None,
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A `rollout_func(prompts, trainer)` returning one row per rollout, `rollouts_per_prompt` per prompt in order.

    `max_concurrency`: rollouts at once (None: the runner's own). The filler token of a failed row (see formats.py)
    is the trainer's first EOS id unless given.
    """
    if rollouts_per_prompt < 1:
        raise ValueError(f"rollouts_per_prompt must be at least 1, got {rollouts_per_prompt}")

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        requests = [to_request(prompt) for prompt in prompts for _ in range(rollouts_per_prompt)]
        results = _run_sync(lambda: runner.run_rollouts(requests, max_concurrency=max_concurrency, progress=False))
        filler = filler_token_id if filler_token_id is not None else _filler_token_id(trainer)
        return trl_batch(results, filler_token_id=filler)

    return rollout_func
