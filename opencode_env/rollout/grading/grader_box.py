"""The grader's box: a sandbox of the rollout's own spec that the agent never touched, set up as the agent's was
(the task's files written, setup run again, the work dir handed to `user`), into which verify_phase carries the
agent's work dir; and what the copy did not carry, as integrity findings.

Setup is replayed rather than snapshotted: replay works on every backend with the seam we have. On the local backend it
runs beside the agent (started right after the agent's setup), so only the part of it that outlasts the agent adds to a
rollout's time. On the clouds, where a VM bills and holds a slot of the account's cap for as long as it lives, the box
is opened when the agent ends: verify waits for its start and setup, and the rollout costs one VM and one slot while its
agent runs (bench/cloud_grader_cost.py measures both). A host-side snapshot of the agent box's writable layer after
setup would save that part on the local backend for tasks whose setup outlasts their agent; it would also carry whatever
setup's background services wrote later.
"""

from __future__ import annotations

import asyncio
import dataclasses

from opencode_env.rollout.commands import hand_workdir_to_user, setup
from opencode_env.rollout.grading import integrity
from opencode_env.rollout.grading.integrity import Listing
from opencode_env.rollout.state import DeadlineCut, GraderBox, PhaseFailure, RolloutState
from opencode_env.sandbox.base import RolloutSandbox, SandboxError, task_path
from opencode_env.sandbox.tree_carry import Limits, Report, Skipped
from opencode_env.wire import RolloutResult
from opencode_env.wire.grading import FindingKind, IntegrityFinding, capped

CARRY_LIMITS = Limits()
"""What the copy into the grader's box carries at most: bytes, entries, depth, path and name length. The grader's
box has this much more disk than the agent's, so a copy within the caps always fits beside setup's files."""
SKIPPED_KINDS: dict[str, FindingKind] = {
    "symlink": "link",
    "fifo": "special_file",
    "socket": "special_file",
    "device": "special_file",
    "hard_link": "hard_link",
    "unreadable": "unreadable",
    "conflict": "conflict",
    "bytecode": "bytecode",
    "startup_hook": "startup_hook",
    "outside": "outside_work_dir",
}


async def open_box(rollout: RolloutState) -> GraderBox:
    """A new sandbox of the rollout's spec, set up, its grader files listed; PhaseFailure (verify) when it cannot be
    made or set up."""
    limits = rollout.spec.limits
    room = dataclasses.replace(limits, disk_mb=limits.disk_mb + CARRY_LIMITS.max_bytes // 2**20)
    try:
        box = await asyncio.wait_for(
            rollout.backend.create(dataclasses.replace(rollout.spec, limits=room, grader_box="this")),
            timeout=rollout.budget("verify", rollout.deadline.remaining()),
        )
    except TimeoutError as error:
        raise PhaseFailure("sandbox_error", "verify", "the grader's sandbox ran out of time to start") from error
    except SandboxError as error:
        raise PhaseFailure("sandbox_error", "verify", f"the grader's sandbox failed: {error}") from error
    try:
        replayed = rollout.replay or rollout.request
        await _set_up(
            dataclasses.replace(rollout, request=replayed, sandbox=box, result=RolloutResult(), progress=None)
        )
        listing = await _grader_files(rollout, box)
    except BaseException:
        await asyncio.shield(box.close())
        raise
    return GraderBox(box, listing)


async def _grader_files(rollout: RolloutState, box: RolloutSandbox) -> Listing | None:
    """The snapshot integrity.py compares the copy against, taken in the grader's box itself: the task's state
    exactly, and off the agent's path (the agent's box needs none)."""
    try:
        return await integrity.scan(box, rollout.workdir, "root", rollout.budget("verify", integrity.SCAN_TIMEOUT_S))
    except ValueError as error:
        rollout.result.warn(
            "grader_files_unsnapshotted", f"grader files not snapshotted, so not restored before verify: {error}"
        )
        return None


async def _set_up(view: RolloutState) -> None:
    """What prepare and setup did in the agent's box (the instruction and OpenCode's configuration aside)."""
    if view.request.workdir:
        await hand_workdir_to_user(view, recursive=False)
    for path, content in view.request.files.items():
        await view.sandbox.write_file(task_path(path, view.workdir), content)
    try:
        await setup(view)
    except DeadlineCut as cut:
        raise PhaseFailure("timeout", "verify", f"in the grader's sandbox: {cut}") from cut
    except PhaseFailure as failure:
        raise PhaseFailure("setup_failed", "verify", f"setup failed in the grader's sandbox: {failure}") from failure


def start_cost_s(rollout: RolloutState) -> float:
    """What verify waits for the grader's box before its first command, where the box is opened when the agent ends
    (the clouds): this rollout's own sandbox start and setup, which the box replays. 0 where it starts beside the
    agent or verify runs in the agent's box."""
    if rollout.request.verify_sandbox != "fresh" or not rollout.backend.capabilities.grader_box_at_agent_end:
        return 0.0
    timings = rollout.result.timings
    return (timings.sandbox_s or 0.0) + (timings.setup_s or 0.0)


def findings(report: Report) -> list[IntegrityFinding]:
    """Each entry of the agent's work dir the copy did not carry (within the findings' bound), and the cap it
    passed."""
    found = capped(
        [
            IntegrityFinding(
                path=_shown(item.path),
                kind=_kind(item),
                act="changed" if item.kind == "changed_git" else "created",
                response="not_carried",
            )
            for item in report.skipped
        ]
    )
    if report.over:
        found.append(IntegrityFinding(path=".", kind="over_limit", act="created", response="refused"))
    return found


def _kind(item: Skipped) -> FindingKind:
    if item.kind in SKIPPED_KINDS:
        return SKIPPED_KINDS[item.kind]
    return "git_config" if item.path.rsplit("/", 1)[-1].casefold() == ".git" else "package_metadata"


def _shown(path: str) -> str:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
