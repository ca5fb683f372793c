"""A task's agent skills (`skills_dir`: <name>/SKILL.md and the files beside them) given to OpenCode: read from the
sandbox by the host (text files, bounded, no link followed, as artifacts are) and written where the sandbox reads
but cannot change them (the control directory), a skills path of OpenCode's config."""

from __future__ import annotations

import posixpath

from opencode_env.rollout.collect import collect_artifacts
from opencode_env.rollout.state import RolloutState

SKILLS_CONTROL_DIR = "skills"


async def give_skills(rollout: RolloutState) -> str | None:
    """The directory OpenCode reads the task's skills from, or None when the request has none (or none were
    found: a warning says which files were left out, and why)."""
    skills_dir = rollout.request.skills_dir
    if skills_dir is None:
        return None
    root = skills_dir.rstrip("/")
    found = await collect_artifacts(rollout.sandbox, [root])
    for why in found.extra:
        rollout.result.warn("skill_left_out", f"skills_dir: {why}", fix="skills are text files, 1 MiB each at most")
    written = ""
    for path, text in sorted(found.text.items()):
        relative = posixpath.relpath(path, root)
        written = await rollout.sandbox.write_control_file(f"{SKILLS_CONTROL_DIR}/{relative}", text)
        written = written[: -len(relative) - 1]
    return written or None
