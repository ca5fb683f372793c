"""Many rollouts over any runner, the one way every `Runner.run_rollouts` does it: at most `concurrency` lanes pull
the requests in order, each result lands at its request's index, and a progress bar (tqdm, on stderr) counts them."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from opencode_env.wire.request import RolloutRequest
from opencode_env.wire.result import RolloutResult

RunOne = Callable[[RolloutRequest], Awaitable[RolloutResult]]
Lane = Callable[[], AbstractAsyncContextManager[RunOne]]
"""What one lane runs its requests with, opened once per lane (a server session; for most runners the runner's own
`run_rollout`)."""
Unrun = Callable[[RolloutRequest, BaseException | None], RolloutResult]


def concurrency_of(max_concurrency: int | None, default: int) -> int:
    """A caller's `max_concurrency`, or the runner's default when None; below 1 is the caller's error."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    return max_concurrency or default


def lane_of(run_one: RunOne) -> Lane:
    """A lane that needs nothing opened: every request goes to `run_one`."""

    @asynccontextmanager
    async def lane() -> AsyncIterator[RunOne]:
        yield run_one

    return lane


async def fan_out(
    requests: Sequence[RolloutRequest],
    lane: Lane,
    *,
    concurrency: int,
    progress: bool,
    unrun: Unrun | None = None,
) -> list[RolloutResult]:
    """Every request's result, in request order, at most `concurrency` at once.

    A lane that raises ends. Without `unrun` the first such error cancels the other lanes and is raised; with it,
    the other lanes go on, and each request no lane finished gets `unrun(request, the error)`."""
    results: list[RolloutResult | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)
    bar = _bar(len(requests)) if progress else None

    async def drain() -> None:
        async with lane() as run_one:
            while not queue.empty():
                index = queue.get_nowait()
                result = await run_one(requests[index])
                results[index] = result
                if bar is not None:
                    bar.set_postfix_str(f"last: {result.status}")
                    bar.update(1)

    lanes = [asyncio.ensure_future(drain()) for _ in range(min(concurrency, len(requests)))]
    try:
        if unrun is None:
            await asyncio.gather(*lanes)
            return [result for result in results if result is not None]
        outcomes = await asyncio.gather(*lanes, return_exceptions=True)
    finally:
        for pending in lanes:
            pending.cancel()
        if bar is not None:
            bar.close()
    failure = next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None)
    return [
        result if result is not None else unrun(request, failure)
        for result, request in zip(results, requests, strict=True)
    ]


def _bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr)
