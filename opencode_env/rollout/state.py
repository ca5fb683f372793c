"""What one rollout carries through its phases (`RolloutState`), how a phase fails (`PhaseFailure`), and the
agent's log paths every phase agrees on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.grading.integrity import Listing
from opencode_env.sandbox.base import (
    AGENT_LOG_DIR,
    RolloutSandbox,
    SandboxBackend,
    SandboxSpec,
)
from opencode_env.settings import Settings
from opencode_env.wire import (
    CommandResult,
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


class DeadlineCut(PhaseFailure):
    """A setup or verify command timed out inside a budget the rollout's deadline had cut below its own timeout: the
    run is ours to have cut short, so it carries no grade (never a policy 0 from a grader that could not finish)."""

    def __init__(self, phase: Phase, results: list[CommandResult], message: str) -> None:
        super().__init__("timeout", phase, message)
        self.results = results


@dataclass(frozen=True)
class GraderBox:
    """The grader's box (grader_box.py) as verify takes it."""

    sandbox: RolloutSandbox
    grader_files: Listing | None
    """Its work dir's grader configuration as setup left it (integrity.py), put back after the copy."""


@dataclass(frozen=True)
class Ancestors:
    """The directories above the work dir (and HOME) the agent's identity can write, and their entries after setup
    (ancestors.py)."""

    writable: list[str]
    names: list[str]


@dataclass(frozen=True)
class EpisodeEnd:
    """How one episode (setup, the agent or the oracle, verify) ended: its agent's failure, if any, for the caller to
    classify once the turns are collected; whether the proxy died; the turns the proxy had written by its end."""

    failure: PhaseFailure | None = None
    proxy_died: bool = False
    turns_written: int | None = None


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
    verify_room_s: float | None = None
    """What the deadline left verify once our own waiting (the grader's sandbox) was over (commands.raise_if_cut)."""
    ancestors: Ancestors | None = None
    """What the directories above the work dir held after setup, when verify runs in the agent's box."""
    grader_box: asyncio.Future[GraderBox] | None = None
    """The grader's box being made beside the agent (verify_sandbox='fresh'), until verify takes it."""
    turns_before: int = 0
    """The model calls the proxy recorded before this agent ran (an earlier step's agent's)."""
    after_agent: bool = False
    """An agent (or the oracle) already ran in this sandbox (a later step's view): what it left is its doing."""
    replay: RolloutRequest | None = None
    """What the grader's box replays when it is not `request` (a step's: the files and setup of every step so far)."""

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
