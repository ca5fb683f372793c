"""A multi-step rollout (the request's `steps`, Harbor's `[[steps]]`): the pipeline's one episode (setup, the agent or
the oracle, verify) run once per step, in order, in the same sandbox. Each step runs in a view of the rollout whose
request is the step's (its instruction, files, setup, verify and protected files, its timeouts) and whose result is
its own; what the step did is then folded into the rollout's result and its part of `steps`. A step whose verify
graded it under its `min_reward`, or whose episode failed, ends the run: later steps are not run, and say so."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable

from opencode_env.rollout.state import EpisodeEnd, PhaseFailure, RolloutState
from opencode_env.rollout.verify_phase import discard_grader_box
from opencode_env.wire import PhaseTimings, RolloutRequest, RolloutResult, StepResult, is_infrastructure_failure
from opencode_env.wire.steps import MAX_STEP_RESULT_CHARS, below_min_reward, combined

Episode = Callable[[RolloutState], Awaitable[EpisodeEnd]]
FOLDED_TIMINGS = ("prepare_s", "setup_s", "proxy_s", "agent_s", "verify_s")


def step_request(request: RolloutRequest, index: int) -> RolloutRequest:
    """The request one step runs as (pure): the request's own setup and files come before the first step's."""
    step = request.steps[index]
    first = index == 0
    return request.model_copy(
        update={
            "instruction": step.instruction,
            "files": {**request.files, **step.files} if first else dict(step.files),
            "setup": [*request.setup, *step.setup] if first else list(step.setup),
            "verify": request.verify if step.verify is None else list(step.verify),
            "verify_files": {**request.verify_files, **step.verify_files},
            "agent_timeout_s": step.agent_timeout_s or request.agent_timeout_s,
            "verify_timeout_s": step.verify_timeout_s or request.verify_timeout_s,
            "solution": None if request.solution is None else list(step.solution),
            "steps": [],
        }
    )


def replayed_request(request: RolloutRequest, index: int) -> RolloutRequest:
    """What the grader's box of step `index` replays (pure): the files and setup of every step up to it, in order,
    so the box stands as the agent's did before the step's agent ran (its work dir is then the agent's copy)."""
    done = request.steps[: index + 1]
    files = dict(request.files)
    for step in done:
        files.update(step.files)
    setup = [*request.setup, *(command for step in done for command in step.setup)]
    return step_request(request, index).model_copy(update={"files": files, "setup": setup})


async def run_steps(rollout: RolloutState, episode: Episode) -> EpisodeEnd | None:
    """Each step through `episode`, in order, until one fails or is graded under its min_reward; the rollout's reward
    is then the steps' by the request's step_reward. Returns the end of the last episode that ran (its agent failure,
    for the pipeline to classify once the turns are in)."""
    request, result = rollout.request, rollout.result
    result.steps = [
        StepResult(name=step.name, instruction=step.instruction[:MAX_STEP_RESULT_CHARS], min_reward=step.min_reward)
        for step in request.steps
    ]
    end: EpisodeEnd | None = None
    turns = 0
    try:
        for index, part in enumerate(result.steps):
            view = dataclasses.replace(_view(rollout, index), turns_before=turns)
            started = time.monotonic()
            part.status, part.first_turn, part.end_turn = "failed", turns, turns
            try:
                end = await episode(view)
            except PhaseFailure as failure:
                part.error = str(failure)[:MAX_STEP_RESULT_CHARS]
                if index and not is_infrastructure_failure(failure.status) and view.result.reward is None:
                    _graded_zero(view.result, part)
                _not_run(result, index, f"step {part.name} ended {failure.status}")
                raise
            finally:
                await discard_grader_box(view)
                part.wall_s = round(time.monotonic() - started, 4)
                _fold(view, rollout, part)
            if end.turns_written is not None:
                turns = part.end_turn = max(end.turns_written, turns)
            if stopped := _stopped_by(view.result, part, end):
                _not_run(result, index, stopped)
                break
            part.status = "completed"
    finally:
        result.reward, result.reward_metrics = combined(result.steps, request.step_reward)
        graded = [part for part in result.steps if part.reward is not None]
        result.reward_source = graded[-1].reward_source if graded else "none"
    return end


def close_turn_ranges(result: RolloutResult) -> None:
    """The last step that ran ends at the last turn (its calls were never drained apart: nothing ran after it); every
    range within the turns collected (a trace cut at its bound holds fewer)."""
    ran = [part for part in result.steps if part.status != "not_run"]
    if ran:
        ran[-1].end_turn = len(result.proxy_turns)
    for part in result.steps:
        part.end_turn = min(part.end_turn, len(result.proxy_turns))
        part.first_turn = min(part.first_turn, part.end_turn)


def _view(rollout: RolloutState, index: int) -> RolloutState:
    """The rollout as step `index` sees it: its request, a result of its own, nothing of an earlier step's verify."""
    timings = PhaseTimings(sandbox_s=rollout.result.timings.sandbox_s)  # a cloud grader box's start cost reads it
    return dataclasses.replace(
        rollout,
        request=step_request(rollout.request, index),
        result=RolloutResult(timings=timings, sandbox_id=rollout.result.sandbox_id, backend=rollout.result.backend),
        replay=replayed_request(rollout.request, index),
        after_agent=index > 0,
        grader_box=None,
        grader_files=None,
        ancestors=None,
        verify_room_s=None,
    )


def _fold(view: RolloutState, rollout: RolloutState, part: StepResult) -> None:
    """What a step did into its part and the rollout's result: command results, findings and warnings added to the
    rollout's, its grade into its part."""
    step, result = view.result, rollout.result
    part.reward, part.reward_source, part.reward_metrics = step.reward, step.reward_source, dict(step.reward_metrics)
    part.agent_exit_code = step.agent_exit_code
    result.agent_exit_code = step.agent_exit_code
    result.setup_results += step.setup_results
    result.solution_results += step.solution_results
    result.verify_results += step.verify_results
    result.integrity += step.integrity
    result.notices += step.notices
    result.warnings += step.warnings
    result.grade_isolation = step.grade_isolation
    if step.status != "completed":
        result.status, result.failed_phase, result.error = step.status, step.failed_phase, step.error
    if "verify" in step.enforcement:
        result.enforcement["verify"] = step.enforcement["verify"]
    for name in FOLDED_TIMINGS:
        spent = getattr(step.timings, name)
        if spent is not None:
            setattr(result.timings, name, round((getattr(result.timings, name) or 0.0) + spent, 4))
    rollout.opencode_config = view.opencode_config or rollout.opencode_config
    rollout.instruction_path = view.instruction_path or rollout.instruction_path


def _graded_zero(step: RolloutResult, part: StepResult) -> None:
    """A later step that could not reach its verify for what the task or the earlier agent left (its files could not
    be written, its setup failed) is graded 0.0, never left out of the mean: an agent that breaks the next step
    must not keep the mean of the steps before it."""
    step.reward, step.reward_source = 0.0, "verify_pass_rate"
    part.error = f"graded 0: the step could not run after the earlier steps' agent: {part.error}"[
        :MAX_STEP_RESULT_CHARS
    ]


def _stopped_by(step: RolloutResult, part: StepResult, end: EpisodeEnd) -> str | None:
    """Why the run ends after this step: its verify refused it (a policy outcome, the rollout's status too), its
    agent failed, or its grade is under its min_reward."""
    if step.status != "completed":
        part.error = (step.error or step.status)[:MAX_STEP_RESULT_CHARS]
        return f"step {part.name} ended {step.status}"
    if end.failure is not None:
        part.error = str(end.failure)[:MAX_STEP_RESULT_CHARS]
        return f"step {part.name}'s agent failed"
    if (why := below_min_reward(part.min_reward, part.reward, part.reward_metrics)) is not None:
        part.status, part.error = "below_min_reward", why
        return f"step {part.name}: {why}"
    return None


def _not_run(result: RolloutResult, index: int, why: str) -> None:
    later = result.steps[index + 1 :]
    if not later:
        return
    names = ", ".join(part.name for part in later)
    for part in later:
        part.error = f"not run: {why}"[:MAX_STEP_RESULT_CHARS]
    result.warn("steps_not_run", f"{why}: steps {names} not run", severity="note")
