"""Verify: the grade comes from verify alone, run as the grader, in the agent's sandbox or in a fresh one."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Coroutine, Mapping, Sequence

from opencode_env.rollout import task_dirs
from opencode_env.rollout.commands import raise_if_cut, run_commands
from opencode_env.rollout.grading import (
    ancestors,
    by_value,
    git_rebuild,
    graded_tests,
    grader_box,
    integrity,
    verify_path,
)
from opencode_env.rollout.grading.grader_env import declares_repository, verify_environment
from opencode_env.rollout.grading.reward import Reward, read_reward
from opencode_env.rollout.grading.test_shape import choose_mode
from opencode_env.rollout.state import DeadlineCut, PhaseFailure, RolloutState, cancelling
from opencode_env.sandbox.base import (
    REWARD_FILES,
    RolloutSandbox,
    Sandbox,
    SandboxError,
)
from opencode_env.wire import CommandResult, RolloutResult
from opencode_env.wire.grading import (
    AgentAct,
    FindingKind,
    GradedTests,
    GradeIsolation,
    GraderResponse,
    IntegrityFinding,
)

log = logging.getLogger("opencode_env.rollout.verify_phase")

CLOSE_TIMEOUT_S = 30.0
AGENT_CAUSED_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EMLINK, errno.ENAMETOOLONG, errno.ELOOP})
AGENT_CAUSED_SIGNS = ("No space left on device", "Disk quota exceeded", "Too many links", "File name too long")
"""What a cloud hand-over's script prints when the agent's acts made it fail."""


async def verify(rollout: RolloutState) -> None:
    """The reward comes from verify alone, run as the grader: the agent's processes are gone (they died with its
    command). By default in the grader's box (a sandbox the agent never touched, fed a copy of its work dir the host
    made: fresh_verify); with verify_sandbox='same', in the agent's own box, its work dir handed to the grader and
    the protected files written in from outside, with a fresh HOME and /tmp."""
    await record_prewritten_reward(rollout)
    if rollout.request.verify_sandbox == "fresh":
        await fresh_verify(rollout)
        return
    rollout.verify_room_s = rollout.deadline.remaining()
    path = await verify_path.narrowed(rollout, rollout.sandbox, environment(rollout))
    left = await ancestors.clear(rollout, rollout.sandbox, path)
    if left is not None:
        refuse(rollout, left)
        return
    if not await clear_task_dirs(rollout, rollout.sandbox):
        return
    if not await hand_over(rollout, rollout.sandbox, rollout.request.verify_files):
        return
    if await put_grader_files_back(rollout, rollout.sandbox):
        await grade(rollout, rollout.sandbox, "agent_box", path=path)


async def record_prewritten_reward(rollout: RolloutState) -> None:
    """A reward file in the agent's box before verify is the agent's (verify has not run): a finding each. The
    hand-over replaces it with the host's empty one (agent's box), or verify never sees it (grader's box)."""
    response: GraderResponse = "not_carried" if rollout.request.verify_sandbox == "fresh" else "removed"
    for path in REWARD_FILES:
        try:
            await rollout.sandbox.read_tail(path, 1)
        except FileNotFoundError:
            continue
        finding = IntegrityFinding(path=path, kind="reward_file", act="created", response=response)
        rollout.result.integrity = [*rollout.result.integrity, finding]


async def hand_over(rollout: RolloutState, sandbox: RolloutSandbox, protected: Mapping[str, str]) -> bool:
    """The work dir to the grader; False (graded 0, a policy status) when it failed for a reason only the agent
    can have caused: its disk full (blocks or inodes), names or links past the system's limits."""
    try:
        await sandbox.hand_to_grader(protected)
    except OSError as error:
        if error.errno not in AGENT_CAUSED_ERRNOS:
            raise
        refuse(rollout, f"{os.strerror(error.errno or 0)} ({error.filename or 'the work dir'})")
        return False
    except SandboxError as error:
        if not any(sign in str(error) for sign in AGENT_CAUSED_SIGNS):
            raise
        refuse(rollout, str(error)[-300:])
        return False
    return True


async def clear_task_dirs(rollout: RolloutState, sandbox: RolloutSandbox) -> bool:
    """The work dir's directories that hold the task's handed files are the task's alone (task_dirs.py): the
    agent's entries there removed, each a finding; False (graded 0, a policy status) when that failed."""
    request = rollout.request
    cleared = await task_dirs.clear(
        sandbox,
        request.verify_files,
        request.files,
        workdir=rollout.workdir,
        timeout_s=rollout.budget("verify", integrity.SCAN_TIMEOUT_S),
    )
    if isinstance(cleared, str):
        refuse(rollout, cleared)
        return False
    rollout.result.integrity += cleared
    return True


def refuse(rollout: RolloutState, why: str) -> None:
    """Verify cannot run because of what the agent did to its own sandbox: reward 0, and the status says so."""
    result = rollout.result
    result.reward, result.reward_source = 0.0, "verify_pass_rate"
    result.status, result.failed_phase = "agent_error", "verify"
    result.error = f"the agent's sandbox left the grader unable to run verify (graded 0): {why}"


async def snapshot_grader_files(rollout: RolloutState) -> None:
    """After setup, before the agent, when verify runs in the agent's box: the work dir's grader configuration as
    the task left it (integrity.py; the grader's box takes its own). An image without the tools to list it (find,
    tar, base64) keeps verify's hardened environment alone, with a warning."""
    if rollout.request.verify_sandbox != "same":
        return
    try:
        rollout.grader_files = await integrity.scan(
            rollout.sandbox, rollout.workdir, "root", rollout.budget("setup", integrity.SCAN_TIMEOUT_S)
        )
    except ValueError as error:
        rollout.result.warn(
            "grader_files_unsnapshotted", f"grader files not snapshotted, so not restored before verify: {error}"
        )


async def put_grader_files_back(rollout: RolloutState, sandbox: RolloutSandbox) -> bool:
    """The task's grader configuration back in `sandbox`'s work dir (the grader's already), the agent's removed,
    each act a finding. False when verify cannot run (graded 0 already): the work dir cannot even be listed (only
    the agent can have made it so: millions of bytecode files, say), or the hand-over failed for the agent's acts."""
    request, result = rollout.request, rollout.result
    if rollout.grader_files is None:
        return True
    timeout_s = rollout.budget("verify", integrity.SCAN_TIMEOUT_S)
    try:
        plan = await integrity.check(
            sandbox,
            workdir=rollout.workdir,
            before=rollout.grader_files,
            solution_files=request.solution_files,
            timeout_s=timeout_s,
        )
    except ValueError as error:
        refuse(rollout, f"its work dir's grader files could not be checked: {error}")
        return False
    result.integrity += plan.findings
    if plan.restore and not await hand_over(rollout, sandbox, {**plan.restore, **request.verify_files}):
        return False
    await integrity.remove(sandbox, plan.remove, workdir=rollout.workdir, timeout_s=timeout_s)
    return True


def start_grader_box(rollout: RolloutState) -> None:
    """The grader's box made and set up: right after setup, beside the agent, so verify waits only for what is left
    of it; or, on a backend whose sandboxes cost while they wait (the clouds), when verify begins."""
    if rollout.request.verify_sandbox == "fresh" and rollout.grader_box is None:
        rollout.grader_box = asyncio.ensure_future(grader_box.open_box(rollout))


async def discard_grader_box(rollout: RolloutState) -> None:
    """The grader's box of a rollout that ended before verify took it: stopped, closed."""
    pending, rollout.grader_box = rollout.grader_box, None
    if pending is None:
        return
    if not pending.done():
        pending.cancel()
    try:
        box = await asyncio.shield(pending) if not pending.cancelled() else None
    except asyncio.CancelledError:
        if cancelling():
            raise
        return
    except (PhaseFailure, SandboxError, OSError) as error:
        log.info("the unused grader box of %s had failed: %s", rollout.result.sandbox_id, error)
        return
    if box is not None:
        await close_quietly(box.sandbox)


async def fresh_verify(rollout: RolloutState) -> None:
    """Verify in the grader's box (grader_box.py): a new sandbox of the same spec, set up as the agent's was, its
    work dir replaced by the copy the host makes of the agent's (regular files and directories only, every entry
    not carried a finding, a cap passed a policy outcome), then the protected files, then verify. Nothing else of
    the agent's box (HOME, /tmp, the directories above the work dir, processes, metadata) exists there."""
    request, result = rollout.request, rollout.result
    if rollout.grader_box is None:
        start_grader_box(rollout)
    pending, rollout.grader_box = rollout.grader_box, None
    assert pending is not None
    await rollout.report("verify", f"waiting for the grader's {rollout.backend.name} sandbox")
    try:
        wait_s = rollout.budget("verify", rollout.deadline.remaining())
        taken = await asyncio.wait_for(asyncio.shield(pending), timeout=wait_s)
    except BaseException as error:
        rollout.grader_box = pending  # discard_grader_box stops it, or closes the box it made
        if isinstance(error, TimeoutError):
            raise PhaseFailure("sandbox_error", "verify", "the grader's sandbox ran out of time to start") from error
        if isinstance(error, SandboxError):
            raise PhaseFailure("sandbox_error", "verify", f"the grader's sandbox failed: {error}") from error
        raise
    box, rollout.grader_files = taken.sandbox, taken.grader_files
    rollout.verify_room_s = rollout.deadline.remaining()
    try:
        result.enforcement["verify"] = f"grader's sandbox {box.sandbox_id}"
        if not await carry_work(rollout, box):
            return
        if not await clear_task_dirs(rollout, box):
            return
        if not await hand_over(rollout, box, request.verify_files):
            return
        if await put_grader_files_back(rollout, box):
            await grade(rollout, box, "fresh_box")
    finally:
        await close_quietly(box)


async def carry_work(rollout: RolloutState, box: RolloutSandbox) -> bool:
    """The agent's work dir into the grader's box; False (graded 0, a policy status, a finding) when it is past a
    cap or the copy failed for a reason only the agent can have caused."""
    result = rollout.result
    started = time.monotonic()
    try:
        report = await rollout.sandbox.carry_workdir_to(
            box, keep=tuple(rollout.request.solution_files), limits=grader_box.CARRY_LIMITS
        )
    except OSError as error:
        if error.errno not in AGENT_CAUSED_ERRNOS:
            raise
        refuse(rollout, f"copying its work dir: {os.strerror(error.errno or 0)} ({error.filename or 'the work dir'})")
        return False
    result.integrity += grader_box.findings(report)
    if report.over:
        refuse(rollout, f"its work dir is past a cap of the copy into the grader's box: {report.over}")
        return False
    result.enforcement["verify"] += (
        f", the agent's work dir copied in ({report.files} files, {report.bytes} bytes, "
        f"{len(report.skipped)} entries not carried, {time.monotonic() - started:.3f} s)"
    )
    return True


async def close_quietly(sandbox: Sandbox) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(sandbox.close())), timeout=CLOSE_TIMEOUT_S)
    except TimeoutError:
        log.error("closing sandbox %s took over %ss", sandbox.sandbox_id, CLOSE_TIMEOUT_S)


def environment(rollout: RolloutState) -> dict[str, str]:
    request = rollout.request
    return verify_environment(
        request.env,
        rollout.workdir,
        bytecode_removed=rollout.grader_files is not None,
        agent_repository=declares_repository(request.solution_files),
    )


async def grade(
    rollout: RolloutState, sandbox: RolloutSandbox, isolation: GradeIsolation, *, path: str | None = None
) -> None:
    """`path`: verify's PATH (in the agent's box, only what the agent cannot write: verify_path.py)."""
    request, result = rollout.request, rollout.result
    result.grade_isolation = isolation
    if declares_repository(request.solution_files):
        await git_rebuild.rebuild(rollout, sandbox)
    env = environment(rollout)
    if path is not None:
        env["PATH"] = path
    try:
        result.verify_results = await run_commands(
            rollout,
            "verify",
            request.verify,
            request.verify_timeout_s,
            False,
            sandbox=sandbox,
            identity="grader",
            env=env,
        )
    except DeadlineCut as cut:
        result.verify_results = cut.results
        raise
    if request.tests is not None:
        await run_graded_tests(rollout, sandbox, request.tests, env)
        return
    reward = await read_reward(
        sandbox,
        result.verify_results,
        request.declared_reward_files(),
        reward_range=request.reward_range,
        reward_key=request.reward_key,
    )
    record_reward(result, reward)


def record_reward(result: RolloutResult, reward: Reward) -> None:
    """The reward into the result; one that is not the grader's own word is 0.0, a policy outcome, a finding each."""
    result.reward, result.reward_source, result.reward_metrics = reward.value, reward.source, reward.metrics
    if reward.finding is None:
        if reward.problem:
            result.warnings.append(f"reward: {reward.problem}")
        return
    result.integrity = [*result.integrity, *reward_findings(reward.finding, reward.paths)]
    result.status, result.failed_phase = "agent_error", "verify"
    result.error = f"the reward is not the grader's own ({reward.finding}, graded 0): {reward.problem}"


def reward_findings(kind: FindingKind, paths: Sequence[str]) -> list[IntegrityFinding]:
    act: AgentAct = "created" if kind == "reward_file" else "forged"
    return [IntegrityFinding(path=path[:300], kind=kind, act=act, response="graded_zero") for path in paths]


async def run_graded_tests(
    rollout: RolloutState, sandbox: RolloutSandbox, spec: GradedTests, env: Mapping[str, str]
) -> None:
    """After the verify commands (whose processes are gone with them): the tests and fresh canaries written outside
    the work dir, pytest run isolated, the reward from the JUnit report the host reads, held against pytest's own
    exit status and summary (graded_tests.py)."""
    request, result = rollout.request, rollout.result
    workdir = rollout.workdir
    timeout_s = rollout.budget("verify", request.verify_timeout_s)
    canaries = graded_tests.make_canaries(spec)
    mode = result.test_mode or (await asyncio.to_thread(choose_mode, spec)).mode
    by_value_mode = mode == "by_value"
    clear = graded_tests.clear_command(*(by_value.clear_paths() if by_value_mode else ()))
    await sandbox.run(clear, timeout_s=timeout_s, identity="grader", cwd=workdir)
    handed = {**request.verify_files, **graded_tests.handed_files(spec, canaries)}
    if not await hand_over(rollout, sandbox, {**handed, **(by_value.handed_files() if by_value_mode else {})}):
        return
    budget_s = rollout.budget("verify", request.verify_timeout_s)
    if by_value_mode:
        options, cwd = by_value.runner_options(spec.call_timeout_s), graded_tests.TESTS_DIR
        command = graded_tests.pytest_command(spec, canaries, workdir, options, cwd=cwd)
        tests = sandbox.run(command, timeout_s=budget_s, env=env, cwd=cwd, identity="grader")
        ran, served = await run_beside_server(sandbox, tests, workdir, budget_s)
        result.verify_results.extend([ran, *served])
    else:
        command = graded_tests.pytest_command(spec, canaries, workdir)
        ran = await sandbox.run(command, timeout_s=budget_s, env=env, cwd=workdir, identity="grader")
        result.verify_results.append(ran)
    raise_if_cut(rollout, "verify", [ran], budget_s, request.verify_timeout_s)
    try:
        report: bytes | None = await sandbox.read_file(graded_tests.JUNIT)
    except FileNotFoundError:
        report = None
    graded = await asyncio.to_thread(
        graded_tests.grade, spec, report, canaries=canaries, exit_code=ran.exit_code, stdout=ran.stdout
    )
    result.reward, result.reward_source = graded.reward, "tests"
    result.test_outcomes = graded.outcomes
    if graded.forged:
        result.integrity = [*result.integrity, *graded_tests.forged_findings(graded.forged)]
        result.status, result.failed_phase = "agent_error", "verify"
        result.error = f"the test report is not pytest's own (graded 0): {'; '.join(graded.forged)[:500]}"
    if by_value_mode:
        await record_broken_channel(sandbox, result)


async def record_broken_channel(sandbox: RolloutSandbox, result: RolloutResult) -> None:
    """By value, the code under test's process must answer every call: when the channel to it broke (the process
    died, wrote what is not a frame, closed its socket, or did not answer in time) the tests' process said so, and
    the grade is 0 with a finding, whatever the tests that ran before it said. Never a run in process instead."""
    try:
        marker: bytes | None = await sandbox.read_tail(by_value.BROKEN, by_value.MAX_BROKEN_READ)
    except FileNotFoundError:
        marker = None
    why = by_value.broken_reason(marker)
    if why is None:
        return
    finding = IntegrityFinding(path=why, kind="by_value_broken", act="forged", response="graded_zero")
    result.integrity = [*result.integrity, finding]
    result.reward = 0.0
    if result.status != "agent_error":
        result.status, result.failed_phase = "agent_error", "verify"
        result.error = f"the code under test's process broke the by-value channel (graded 0): {why}"


async def run_beside_server(
    sandbox: RolloutSandbox, tests: Coroutine[object, object, CommandResult], workdir: str, budget: float
) -> tuple[CommandResult, list[CommandResult]]:
    """pytest, and beside it the code under test's server (by_value.py: started as root, it drops to an identity
    that owns nothing), the work dir sealed to the tests' identity meanwhile; the server is given GRACE_S to exit
    once pytest has, then killed. Its result (when it ended) goes with pytest's."""
    sealed = await sandbox.run(by_value.seal_command(workdir), timeout_s=by_value.ROOT_STEP_S, cwd="/", identity="root")
    unseal = by_value.unseal_command(workdir, sealed.stdout)
    if sealed.exit_code != 0 or unseal is None:
        tests.close()
        raise PhaseFailure("sandbox_error", "verify", f"the work dir could not be sealed for by-value tests: {sealed}")
    server = asyncio.ensure_future(
        sandbox.run(by_value.server_command(workdir, budget), timeout_s=budget, cwd="/", identity="root")
    )
    try:
        ran = await tests
        done, _ = await asyncio.wait([server], timeout=by_value.GRACE_S)
    finally:
        if not server.done():
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        await sandbox.run(unseal, timeout_s=by_value.ROOT_STEP_S, cwd="/", identity="root")
    served = [server.result()] if done and server.exception() is None else []
    return ran, served
