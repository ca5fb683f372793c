"""The steps export through the real command line: it starts a process, so it lives here, not in the unit tier."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from opencode_env.training import (
    StepSample,
)
from tests.unit.test_steps_coverage import thinking_rollout

REPO = Path(__file__).resolve().parents[2]


def test_export_steps_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "thinking.json"
    path.write_text(thinking_rollout().model_dump_json())
    done = subprocess.run(
        ["uv", "run", "--frozen", "opencode-env", "export", "--format", "steps", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [StepSample.model_validate_json(line) for line in done.stdout.splitlines()]
    assert [(s.turn, len(s.completion_ids), s.usable) for s in steps] == [(n, 381, True) for n in range(14)]
    assert steps[5].prompt_ids == thinking_rollout().proxy_turns[5].prompt_token_ids
    assert json.loads(done.stdout.splitlines()[0])["env_mask"] == [1] * 381
    assert "14 rows (14 usable, 0 not) from 1 rollouts" in done.stderr
    assert (
        "coverage: 5,334 of 5,334 agent tokens (100.0%, 14 of 14 turns) in the step rows; 0 auxiliary and 0 "
        "unattributed tokens are no agent tokens"
    ) in done.stderr
