"""A task's skills (`skills_dir`) reach OpenCode's skill tool, read by the host from the task's image (bounded, no
link followed) into a place the agent's tools can read but not change."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash
from opencode_env.wire import RolloutRequest
from tests.helpers import rollout

BODY = "Tickets are numbered TKT-7 and above; never reuse one."
SKILL = f"---\nname: ticket-rules\ndescription: Use when numbering tickets.\n---\n\n{BODY}\n"
LEAVE_SKILLS = (
    "mkdir -p /srv/skills/ticket-rules && cat > /srv/skills/ticket-rules/SKILL.md <<'EOF'\n"
    f"{SKILL}EOF\n"
    "ln -s /etc/shadow /srv/skills/ticket-rules/shadow.md"
)


@pytest.mark.timeout(600)
async def test_the_tasks_skills_reach_the_skill_tool_and_stay_the_tasks(backend: LocalBackend) -> None:
    script = Script(
        steps=[
            Step(tool_calls=[ToolCallStep(name="skill", arguments={"name": "ticket-rules"})]),
            bash("for f in $(find / -path /proc -prune -o -name SKILL.md -print 2>/dev/null); do "
                 "echo FOUND $f; echo changed >> $f && echo CHANGED $f; done; echo TRIED"),
        ]
    )  # fmt: skip
    outcome = await rollout(
        backend, script, image=build_base_image(), setup=[LEAVE_SKILLS], skills_dir="/srv/skills", setup_as="root"
    )
    result = outcome.result
    assert result.status == "completed", (result.error, result.setup_results)
    messages = json.dumps(outcome.exchanges[-1].request.get("messages", []))
    assert BODY in messages, "the skill tool read the task's skill"
    assert "TRIED" in messages
    changed = [line for line in messages.split("\\n") if line.startswith("CHANGED ")]
    assert "FOUND /run/opencode-env/skills/ticket-rules/SKILL.md" in messages, "the agent's tools see OpenCode's copy"
    assert not any("opencode-env" in line for line in changed), changed


def test_a_skills_dir_outside_the_tasks_roots_is_refused() -> None:
    for path in ("skills", "/etc/skills", "/home/user/.config/opencode/skills"):
        with pytest.raises(ValidationError, match="skills_dir"):
            RolloutRequest(instruction="x", skills_dir=path)
