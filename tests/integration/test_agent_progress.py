"""Progress inside the agent phase: as the proxy records model calls, the rollout reports how many and how many
tokens the model sampled so far; the last report matches what the result holds."""

from __future__ import annotations

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.testing.demo import demo_request
from opencode_env.testing.script import Script, bash, demo_script, say, write
from opencode_env.testing.scripted_model import ScriptedModelServer


async def test_the_agent_phase_reports_each_model_call(backend: LocalBackend) -> None:
    reports: list[tuple[str, str]] = []
    with ScriptedModelServer(demo_script()) as model:
        result = await run_rollout(
            demo_request(model.base_url), backend, progress=lambda phase, text: reports.append((phase, text))
        )
    assert result.status == "completed", result.error
    during = [text for phase, text in reports if phase == "agent" and "model call" in text]
    calls = len(result.proxy_turns)
    tokens = sum(len(turn.completion_tokens) for turn in result.proxy_turns)
    assert during, reports
    assert during[-1].startswith(f"{calls} model calls recorded, {tokens} tokens sampled")
    counts = [int(text.split()[0]) for text in during]
    assert counts == sorted(set(counts)), "each report names more calls than the one before"


async def test_the_progress_names_the_last_tool_opencode_finished(backend: LocalBackend) -> None:
    script = Script(steps=[write("/home/user/workdir/a.txt", "a\n"), bash("sleep 3; echo slept", "Wait"), say("ok")])
    reports: list[str] = []
    with ScriptedModelServer(script) as model:
        result = await run_rollout(
            demo_request(model.base_url, verify=[]), backend, progress=lambda phase, text: reports.append(text)
        )
    assert result.status == "completed", result.error
    assert any(text.startswith("2 model calls recorded") and "; last tool: write (" in text for text in reports), (
        reports
    )
