"""One real rollout for the quick tier: the real OpenCode, the scripted model on loopback, the local backend, the demo
task end to end."""

from __future__ import annotations

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.script import demo_script
from tests.helpers import rollout


async def test_demo_task_completes_with_full_reward(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, demo_script())
    result = outcome.result
    assert result.status == "completed", result.error
    assert (result.reward, result.reward_source) == (1.0, "reward_txt")
    assert result.files["add.py"] == "def add(a, b):\n    return a + b\n"
    assert [call.tool for call in result.tool_calls] == ["write", "bash"]
    assert result.tool_calls[1].exit_code == 0
    assert result.agent_exit_code == 0
    assert result.agent_final_text.startswith("I wrote add.py")
    assert result.usage.llm_calls == len(outcome.exchanges) == 3
    assert result.opencode_version == "1.18.33"
    assert result.timings.agent_s is not None
    assert result.timings.verify_s is not None
