"""What one rollout carries through its phases (`RolloutState`), how a phase fails (`PhaseFailure`), and the
agent's log paths every phase agrees on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.integrity import Listing
from opencode_env.sandbox.base import (
    AGENT_LOG_DIR,
    RolloutSandbox,
    SandboxBackend,
    SandboxSpec,
)
from opencode_env.settings import Settings
from opencode_env.wire import (
    Deadline,
    DeadlineExceeded,
    Phase,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
)

ProgressCallback = Callable[[Phase, str], Awaitable[None] | None]
T = TypeVar("T")
EVENTS_PATH = f"{AGENT_LOG_DIR}/events.jsonl"
AGENT_STDERR_PATH = f"{AGENT_LOG_DIR}/stderr.log"


class PhaseFailure(Exception):
    def __init__(self, status: RolloutStatus, phase: Phase, message: str) -> None:
        super().__init__(message)
        self.status: RolloutStatus = status
        self.phase: Phase = phase


@dataclass(frozen=True)
class GraderBox:
    """The grader's box (grader_box.py) as verify takes it."""

    sandbox: RolloutSandbox
    grader_files: Listing | None
    """Its work dir's grader configuration as setup left it (integrity.py), put back after the copy."""


@dataclass
class RolloutState:
    request: RolloutRequest
    upstream: Upstream
    sandbox: RolloutSandbox
    result: RolloutResult
    deadline: Deadline
    progress: ProgressCallback | None
    backend: SandboxBackend
    spec: SandboxSpec
    settings: Settings
    instruction_path: str = ""
    opencode_config: dict[str, Any] | None = None
    """OpenCode's config as rendered for this rollout (its hash goes into the result's provenance)."""
    grader_files: Listing | None = None
    """The work dir's grader configuration as setup left it (integrity.py), put back before verify."""
    grader_box: asyncio.Future[GraderBox] | None = None
    """The grader's box being made beside the agent (verify_sandbox='fresh'), until verify takes it."""

    @property
    def workdir(self) -> str:
        return self.spec.workdir

    async def report(self, phase: Phase, message: str) -> None:
        if self.progress is not None:
            outcome = self.progress(phase, message)
            if outcome is not None:
                await outcome

    async def timed(self, phase: Phase, work: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            return await work
        except asyncio.CancelledError:
            # The innermost phase a cancellation cut is the one a cancelled result names.
            self.result.failed_phase = self.result.failed_phase or phase
            raise
        finally:
            setattr(self.result.timings, f"{phase}_s", round(time.monotonic() - started, 4))

    def budget(self, phase: Phase, wanted_s: float) -> float:
        try:
            return self.deadline.budget(wanted_s)
        except DeadlineExceeded as exceeded:
            raise PhaseFailure("timeout", phase, str(exceeded)) from exceeded


def cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
