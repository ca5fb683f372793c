"""The phases before the agent: install what the sandbox lacks, prepare (task files, the instruction), setup (the
task's commands, then the work dir handed to `user`); and running a phase's commands in order."""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
from collections.abc import Mapping

from opencode_env.rollout import opencode
from opencode_env.rollout.state import DeadlineCut, PhaseFailure, RolloutState
from opencode_env.sandbox.base import (
    Identity,
    Sandbox,
    SandboxError,
    task_path,
)
from opencode_env.wire import (
    CommandResult,
    Phase,
    RolloutRequest,
)

log = logging.getLogger("opencode_env.rollout.commands")

INSTALL_TIMEOUT_S = 600.0
INSTALL_ATTEMPTS = 3
SANDBOX_USER_IDS = "1000:1000"
"""The agent's tools' uid and gid on every backend."""
_NO_WORKDIR = re.compile(
    r"^(?:nsenter: cannot (?:change directory to|open current working directory)|seccomp_exec: the working directory)"
)


def command_failure(what: str, results: list[CommandResult], workdir: str) -> str:
    """Why the last of `results` (a phase's commands, in order) failed, in words: the last line it wrote on stderr,
    or, when the command never started because its working directory was missing, that."""
    failed = results[-1]
    why = "timed out" if failed.timed_out else f"exited {failed.exit_code}"
    message = f"{what} {len(results)} {why}: {failed.cmd[:200]}"
    if failed.exit_code != 0 and _NO_WORKDIR.match(failed.stderr):
        return f"{message}: it never started, since the work dir {workdir} does not exist in the sandbox"
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    return f"{message} (stderr: {lines[-1][-300:]})" if lines else message


async def install(rollout: RolloutState) -> str:
    """Install what the sandbox lacks (OpenCode, the proxy's packages); install steps alone are retried."""
    tools = rollout.sandbox.tools
    for step in opencode.install_commands(tools, proxy=rollout.request.mode == "transparent_proxy"):
        await rollout.report("install", step.command)
        await _run_install_step(rollout, step)
    if tools.opencode:
        return tools.opencode
    version = await rollout.sandbox.run("opencode --version", timeout_s=rollout.budget("install", 60))
    if version.exit_code != 0:
        raise PhaseFailure("install_error", "install", f"OpenCode does not run after install: {version.stderr[-500:]}")
    rollout.result.opencode_version = version.stdout.strip().splitlines()[-1] if version.stdout.strip() else ""
    return "opencode"


async def _run_install_step(rollout: RolloutState, step: opencode.InstallStep) -> None:
    command = step.command
    for attempt in range(1, INSTALL_ATTEMPTS + 1):
        result = await rollout.sandbox.run(
            command,
            timeout_s=rollout.budget("install", INSTALL_TIMEOUT_S),
            identity="root" if step.privileged else "user",
        )
        if result.exit_code == 0:
            return
        if attempt == INSTALL_ATTEMPTS:
            raise PhaseFailure(
                "install_error", "install", f"{command!r} failed {INSTALL_ATTEMPTS} times: {result.stderr[-1500:]}"
            )
        log.warning("install step failed (attempt %d), retrying: %s", attempt, result.stderr[-300:])
        await asyncio.sleep(rollout.budget("install", 2.0 * attempt))


async def prepare(rollout: RolloutState) -> None:
    await rollout.report("prepare", "writing the task files and the instruction")
    if rollout.request.workdir:
        await hand_workdir_to_user(rollout, recursive=False)
    for path, content in rollout.request.files.items():
        await _write_task_file(rollout, path, content)
    rollout.instruction_path = await rollout.sandbox.write_control_file("instruction.md", rollout.request.instruction)


async def _write_task_file(rollout: RolloutState, path: str, content: str) -> None:
    """A task's file into the sandbox; after an earlier step's agent, a write refused because of what that agent left
    in the way (a link, a directory) is the agent's doing: a policy outcome, never a sandbox failure."""
    try:
        await rollout.sandbox.write_file(task_path(path, rollout.workdir), content)
    except (SandboxError, OSError) as error:
        if not rollout.after_agent:
            raise
        raise PhaseFailure(
            "agent_error",
            "prepare",
            f"{path[:200]}: the step's file could not be written where the agent left something in its way: {error}",
        ) from error


async def run_commands(
    rollout: RolloutState,
    phase: Phase,
    commands: list[str],
    timeout_s: float,
    stop_on_failure: bool,
    *,
    sandbox: Sandbox | None = None,
    identity: Identity = "user",
    env: Mapping[str, str] | None = None,
) -> list[CommandResult]:
    """`env`: the variables the commands get (the request's env when None). A setup or verify command that timed
    out in a budget the deadline had cut below `timeout_s` raises DeadlineCut (with the results so far)."""
    results: list[CommandResult] = []
    for index, cmd in enumerate(commands, start=1):
        await rollout.report(phase, f"{phase} command {index}/{len(commands)}")
        budget_s = rollout.budget(phase, timeout_s)
        result = await (sandbox or rollout.sandbox).run(
            cmd,
            timeout_s=budget_s,
            env=rollout.request.env if env is None else env,
            cwd=rollout.workdir,
            keep_background=phase == "setup",
            identity=identity,
        )
        results.append(result)
        raise_if_cut(rollout, phase, results, budget_s, timeout_s)
        if stop_on_failure and result.exit_code != 0:
            break
    return results


def raise_if_cut(
    rollout: RolloutState, phase: Phase, results: list[CommandResult], budget_s: float, timeout_s: float
) -> None:
    """DeadlineCut when the last of a setup or verify phase's `results` timed out in a budget the rollout's deadline
    had cut below the command's own timeout, and the time was ours to give (the agent's phase is the agent's: its
    cut is an agent timeout). A verify that had room for every command's timeout once our own waiting was over
    (rollout.verify_room_s) lost it to steps whose length the agent sets (its work dir's copy, hand-over, scans):
    that cut stays the agent's (verify_killed, 0.0), so a wrong answer cannot trade its 0 for no grade."""
    last = results[-1]
    if phase not in ("setup", "verify") or not last.timed_out or budget_s >= timeout_s:
        return
    if phase == "verify" and verify_had_room(rollout.request, rollout.verify_room_s):
        return
    raise DeadlineCut(
        phase,
        results,
        f"the rollout's deadline cut {phase} command {len(results)} short ({budget_s:.1f} s of its "
        f"{timeout_s:.0f} s): {last.cmd[:200]}",
    )


def verify_had_room(request: RolloutRequest, room_s: float | None) -> bool:
    """Whether verify had `room_s` (once the grader's sandbox was ready) for every verify command's timeout."""
    needed_s = request.verify_timeout_s * (len(request.verify) + (request.tests is not None))
    return room_s is not None and room_s >= needed_s


async def setup(rollout: RolloutState) -> None:
    request = rollout.request
    identity: Identity = "root" if request.setup_as == "root" else "user"
    try:
        results = await run_commands(
            rollout, "setup", request.setup, request.setup_timeout_s, stop_on_failure=True, identity=identity
        )
    except DeadlineCut as cut:
        rollout.result.setup_results = cut.results
        raise
    rollout.result.setup_results = results
    if results and results[-1].exit_code != 0:
        raise PhaseFailure("setup_failed", "setup", command_failure("setup command", results, rollout.workdir))
    await hand_workdir_to_user(rollout, recursive=True)


async def hand_workdir_to_user(rollout: RolloutState, *, recursive: bool, owner: str = SANDBOX_USER_IDS) -> None:
    """The work dir becomes the agent's: made if missing and owned by `user` before setup (so setup and the task's
    files have it), then, as setup (as root) or the image left it, every entry in it (links themselves, never what
    they name). `owner` (a shell word, uid:gid): whom it is handed to, when not `user` (the image's USER)."""
    workdir = shlex.quote(rollout.workdir)
    command = f"mkdir -p -- {workdir} && chown {'-R ' if recursive else ''}-h {owner} -- {workdir}"
    handed = await rollout.sandbox.run(
        command, timeout_s=rollout.budget("setup", rollout.request.setup_timeout_s), cwd="/", identity="root"
    )
    if handed.exit_code != 0:
        raise PhaseFailure("setup_failed", "setup", f"could not hand {rollout.workdir} to the agent: {handed.stderr}")
