"""What a result says about how a rollout ended: the agent's deadline leaves verify its time, and odd task ids
reach OpenCode as labels, never as flags."""

from __future__ import annotations

from opencode_env.sandbox.local import LocalBackend
from opencode_env.testing.script import Script, demo_script, stall
from tests.helpers import rollout


async def test_a_tight_total_deadline_still_leaves_verify_its_time(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(
        backend,
        Script(steps=[stall(300)]),
        total_timeout_s=40,
        agent_timeout_s=600,
        verify=["true"],
        verify_timeout_s=5,
    )
    result = outcome.result
    assert (result.status, result.failed_phase) == ("agent_timeout", "agent"), result.error
    assert [r.exit_code for r in result.verify_results] == [0]
    assert result.reward == 1.0


async def test_a_task_id_that_looks_like_a_flag_is_only_a_title(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, demo_script(), task_id="-rf")
    assert outcome.result.status == "completed", outcome.result.error
    assert outcome.result.task_id == "-rf"
