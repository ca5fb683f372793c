"""Where rollouts run, as one seam: a `Runner` runs one rollout or many and closes, the way an httpx client takes a
transport. Three implement it: `InProcess` (a sandbox backend in this process, rollout/in_process.py),
`OpenCodeEnv` (a server, client/client.py) and `RayRollouts` (a Ray cluster, cluster/executor.py). An eval
(`run_eval(..., runner=...)`), TRL's `rollout_func` (`make_rollout_func(runner, ...)`) and the examples take any of
them; tests/runner_contract.py holds all three to the same contract."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from opencode_env.wire.request import RolloutRequest
from opencode_env.wire.result import RolloutResult

SandboxPlace = Literal["this_process", "server", "cluster"]


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner declares on itself, for a caller choosing how to drive it."""

    max_concurrency: int
    """Rollouts it runs at once by default (an eval's and `run_rollouts`' concurrency when they are not given)."""
    sandboxes: SandboxPlace
    """Where the sandboxes run: this process's backend, the server's machine, or the cluster's nodes (only
    `this_process` fills a caller's `partial` result as it goes)."""
    where: str
    """The place in words ("backend local", "server http://...", "ray cluster ...: 3 nodes, 12 slots")."""


class Runner(Protocol):
    """Runs rollouts somewhere. A rollout's own failure (its sandbox, its model, its deadline, its node) is its
    result's status, never an exception; a runner that cannot be reached at all may raise (ConnectionError,
    OSError, TimeoutError, RuntimeError)."""

    @property
    def capabilities(self) -> RunnerCapabilities: ...

    async def run_rollout(self, request: RolloutRequest, *, partial: RolloutResult | None = None) -> RolloutResult:
        """One rollout. A runner whose pipeline runs in this process fills `partial` as it goes, so a caller that
        cancels the call still holds what was captured; the others leave it as it was given."""
        ...

    async def run_rollouts(
        self, requests: Sequence[RolloutRequest], *, max_concurrency: int | None = None, progress: bool = True
    ) -> list[RolloutResult]:
        """Every request's result, in request order, at most `max_concurrency` at once (None: the runner's own
        `capabilities.max_concurrency`)."""
        ...

    async def close(self) -> None:
        """Release what the runner holds (sessions, the cluster's node runners); it may not be used afterwards."""
        ...
