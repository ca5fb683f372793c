"""The phases before the agent: install what the sandbox lacks, prepare (task files, the instruction), setup (the
task's commands, then the work dir handed to `user`); and running a phase's commands in order."""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Mapping

from opencode_env.rollout import opencode
from opencode_env.rollout.state import PhaseFailure, RolloutState
from opencode_env.sandbox.base import (
    Identity,
    Sandbox,
    task_path,
)
from opencode_env.wire import (
    CommandResult,
    Phase,
)

log = logging.getLogger("opencode_env.rollout.commands")

INSTALL_TIMEOUT_S = 600.0
INSTALL_ATTEMPTS = 3
SANDBOX_USER_IDS = "1000:1000"
"""The agent's tools' uid and gid on every backend."""


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
        await rollout.sandbox.write_file(task_path(path, rollout.workdir), content)
    rollout.instruction_path = await rollout.sandbox.write_control_file("instruction.md", rollout.request.instruction)


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
    """`env`: the variables the commands get (the request's env when None)."""
    results: list[CommandResult] = []
    for index, cmd in enumerate(commands, start=1):
        await rollout.report(phase, f"{phase} command {index}/{len(commands)}")
        result = await (sandbox or rollout.sandbox).run(
            cmd,
            timeout_s=rollout.budget(phase, timeout_s),
            env=rollout.request.env if env is None else env,
            cwd=rollout.workdir,
            keep_background=phase == "setup",
            identity=identity,
        )
        results.append(result)
        if stop_on_failure and result.exit_code != 0:
            break
    return results


async def setup(rollout: RolloutState) -> None:
    request = rollout.request
    identity: Identity = "root" if request.setup_as == "root" else "user"
    results = await run_commands(
        rollout, "setup", request.setup, request.setup_timeout_s, stop_on_failure=True, identity=identity
    )
    rollout.result.setup_results = results
    if results and results[-1].exit_code != 0:
        failed = results[-1]
        why = "timed out" if failed.timed_out else f"exited {failed.exit_code}"
        raise PhaseFailure("setup_failed", "setup", f"setup command {len(results)} {why}: {failed.cmd[:200]}")
    await hand_workdir_to_user(rollout, recursive=True)


async def hand_workdir_to_user(rollout: RolloutState, *, recursive: bool) -> None:
    """The work dir becomes the agent's: made if missing and owned by `user` before setup (so setup and the task's
    files have it), then, as setup (as root) or the image left it, every entry in it (links themselves, never what
    they name)."""
    workdir = shlex.quote(rollout.workdir)
    command = f"mkdir -p -- {workdir} && chown {'-R ' if recursive else ''}-h {SANDBOX_USER_IDS} -- {workdir}"
    handed = await rollout.sandbox.run(
        command, timeout_s=rollout.budget("setup", rollout.request.setup_timeout_s), cwd="/", identity="root"
    )
    if handed.exit_code != 0:
        raise PhaseFailure("setup_failed", "setup", f"could not hand {rollout.workdir} to the agent: {handed.stderr}")
