"""Progress inside the agent phase: as the proxy records model calls, the rollout reports how many and how many
tokens the model sampled so far; the last report matches what the result holds.

Both tests read one rollout (a module fixture): a write, a bash step that sleeps (so that a report comes while it
runs) and an answer. Counting the calls holds for any script; naming the last tool needs this one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.testing.demo import demo_request
from opencode_env.testing.script import Script, bash, say, write
from opencode_env.testing.scripted_model import ScriptedModelServer
from opencode_env.wire import RolloutResult


@dataclass
class Reported:
    result: RolloutResult
    reports: list[tuple[str, str]]


@pytest.fixture(scope="module")
async def reported(backend: LocalBackend, leak_check: Callable[[], None]) -> Reported:
    script = Script(steps=[write("/home/user/workdir/a.txt", "a\n"), bash("sleep 3; echo slept", "Wait"), say("ok")])
    reports: list[tuple[str, str]] = []
    with ScriptedModelServer(script) as model:
        result = await run_rollout(
            demo_request(model.base_url, verify=[]), backend, progress=lambda phase, text: reports.append((phase, text))
        )
    leak_check()
    return Reported(result, reports)


def test_the_agent_phase_reports_each_model_call(reported: Reported) -> None:
    result, reports = reported.result, reported.reports
    assert result.status == "completed", result.error
    during = [text for phase, text in reports if phase == "agent" and "model call" in text]
    calls = len(result.proxy_turns)
    tokens = sum(len(turn.completion_tokens) for turn in result.proxy_turns)
    assert during, reports
    assert during[-1].startswith(f"{calls} model calls recorded, {tokens} tokens sampled")
    counts = [int(text.split()[0]) for text in during]
    assert counts == sorted(set(counts)), "each report names more calls than the one before"


def test_the_progress_names_the_last_tool_opencode_finished(reported: Reported) -> None:
    assert reported.result.status == "completed", reported.result.error
    texts = [text for _, text in reported.reports]
    assert any(text.startswith("2 model calls recorded") and "; last tool: write (" in text for text in texts), texts
