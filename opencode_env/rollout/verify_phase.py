"""Verify: the grade comes from verify alone, run as the grader, in the agent's sandbox or in a fresh one."""

from __future__ import annotations

import asyncio
import logging

from opencode_env.rollout.commands import INSTALL_TIMEOUT_S, run_commands
from opencode_env.rollout.reward import read_reward
from opencode_env.rollout.state import PhaseFailure, RolloutState
from opencode_env.rollout.workdir_copy import copy_workdir
from opencode_env.sandbox.base import (
    Sandbox,
    SandboxError,
)

log = logging.getLogger("opencode_env.rollout.verify_phase")

WORKDIR_COPY_LIMIT = 256 * 2**20
CLOSE_TIMEOUT_S = 30.0


async def verify(rollout: RolloutState) -> None:
    """The reward comes from verify alone, run as the grader: the agent's processes are gone (they died with its
    command), the work dir is handed to the grader and the protected files written in from outside, and verify
    runs with a fresh HOME and /tmp, in this sandbox or a fresh one that holds only a copy of the work dir."""
    if rollout.request.verify_sandbox == "fresh":
        await fresh_verify(rollout)
        return
    await rollout.sandbox.hand_to_grader(rollout.request.verify_files)
    await grade(rollout, rollout.sandbox)


async def fresh_verify(rollout: RolloutState) -> None:
    """Verify in a new sandbox of the same spec: the task's setup runs there again, then the agent's work dir (as
    the grader packed it) replaces its work dir, then the protected files, then verify. Nothing else of the agent's
    sandbox (HOME, /tmp, processes, planted hooks outside the work dir) exists there."""
    request, result = rollout.request, rollout.result
    await rollout.sandbox.hand_to_grader({})
    await rollout.report("verify", f"creating a fresh {rollout.backend.name} sandbox for verify")
    try:
        fresh = await asyncio.wait_for(
            rollout.backend.create(rollout.spec), timeout=rollout.budget("verify", rollout.deadline.remaining())
        )
    except TimeoutError as error:
        raise PhaseFailure("sandbox_error", "verify", "the fresh verify sandbox ran out of time to start") from error
    except SandboxError as error:
        raise PhaseFailure("sandbox_error", "verify", f"the fresh verify sandbox failed: {error}") from error
    try:
        result.enforcement["verify"] = f"fresh sandbox {fresh.sandbox_id}"
        setup = await run_commands(rollout, "setup", request.setup, request.setup_timeout_s, True, sandbox=fresh)
        if setup and setup[-1].exit_code != 0:
            raise PhaseFailure("setup_failed", "verify", f"setup failed in the fresh verify sandbox: {setup[-1].cmd}")
        copied = await copy_workdir(
            rollout.sandbox,
            fresh,
            timeout_s=rollout.budget("verify", INSTALL_TIMEOUT_S),
            limit_bytes=WORKDIR_COPY_LIMIT,
            workdir=rollout.workdir,
        )
        if copied.exit_code != 0:
            result.verify_results = [copied]
            result.reward, result.reward_source = 0.0, "verify_pass_rate"
            return
        result.enforcement["verify"] += f", work dir copied in ({copied.stdout}, {copied.duration_s} s)"
        await fresh.hand_to_grader(request.verify_files)
        await grade(rollout, fresh)
    finally:
        await close_quietly(fresh)


async def close_quietly(sandbox: Sandbox) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(sandbox.close())), timeout=CLOSE_TIMEOUT_S)
    except TimeoutError:
        log.error("closing sandbox %s took over %ss", sandbox.sandbox_id, CLOSE_TIMEOUT_S)


async def grade(rollout: RolloutState, sandbox: Sandbox) -> None:
    request, result = rollout.request, rollout.result
    result.verify_results = await run_commands(
        rollout, "verify", request.verify, request.verify_timeout_s, False, sandbox=sandbox, identity="grader"
    )
    reward = await read_reward(sandbox, result.verify_results)
    result.reward, result.reward_source = reward.value, reward.source
    if reward.problem:
        log.warning("reward file problem in %s: %s", result.sandbox_id, reward.problem)
