"""`InProcess`: the runner (wire/runner.py) whose sandboxes run on a backend in this process, through the one
pipeline, at most `max_concurrency` rollouts at once."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.settings import Settings
from opencode_env.wire import RolloutRequest, RolloutResult, RunnerCapabilities


class InProcess:
    """Rollouts on `backend` (None: the default backend of this process's settings) in this event loop."""

    def __init__(
        self,
        backend: SandboxBackend | None = None,
        *,
        max_concurrency: int | None = None,
        settings: Settings | None = None,
    ) -> None:
        """`max_concurrency`: rollouts at once (None: the backend's own default, `Capabilities.default_concurrency`).
        `settings`: the operator's (None: this process's environment's, read here)."""
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.settings = settings or Settings.load()
        if backend is None:
            from opencode_env.sandbox import default_backend

            backend = default_backend(self.settings)
        self.backend = backend
        self._capabilities = RunnerCapabilities(
            max_concurrency=max_concurrency or backend.capabilities.default_concurrency,
            sandboxes="this_process",
            where=f"backend {backend.name}",
        )

    @property
    def capabilities(self) -> RunnerCapabilities:
        return self._capabilities

    async def run_rollout(self, request: RolloutRequest, *, partial: RolloutResult | None = None) -> RolloutResult:
        return await run_rollout(request, self.backend, result=partial, settings=self.settings)

    async def run_rollouts(
        self, requests: Sequence[RolloutRequest], *, max_concurrency: int | None = None, progress: bool = True
    ) -> list[RolloutResult]:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        gate = asyncio.Semaphore(max_concurrency or self._capabilities.max_concurrency)
        bar = _bar(len(requests)) if progress else None

        async def one(request: RolloutRequest) -> RolloutResult:
            async with gate:
                result = await self.run_rollout(request)
            if bar is not None:
                bar.set_postfix_str(f"last: {result.status}")
                bar.update(1)
            return result

        try:
            return list(await asyncio.gather(*(one(request) for request in requests)))
        finally:
            if bar is not None:
                bar.close()

    async def close(self) -> None:
        """Nothing to release: every rollout closed its own sandbox."""


def _bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr)
