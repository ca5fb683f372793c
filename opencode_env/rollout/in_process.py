"""`InProcess`: the runner (wire/runner.py) whose sandboxes run on a backend in this process, through the one
pipeline, at most `max_concurrency` rollouts at once."""

from __future__ import annotations

from collections.abc import Sequence

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.settings import Settings
from opencode_env.wire import RolloutRequest, RolloutResult, RunnerCapabilities
from opencode_env.wire.fan_out import concurrency_of, fan_out, lane_of


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
        concurrency = concurrency_of(max_concurrency, self._capabilities.max_concurrency)
        return await fan_out(requests, lane_of(self.run_rollout), concurrency=concurrency, progress=progress)

    async def close(self) -> None:
        """Nothing to release: every rollout closed its own sandbox."""
