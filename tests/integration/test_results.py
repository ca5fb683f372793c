"""What a result says about how a rollout ended: the agent's deadline leaves verify its time, and odd task ids
reach OpenCode as labels, never as flags."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from opencode_env.proxy.request import turn_kind
from opencode_env.rollout.opencode import project_config_removal_command
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import WORKDIR, SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, fail, say, stall
from opencode_env.testing.stub_backend import StubBackend, StubSandbox
from opencode_env.wire import CommandResult, RolloutRequest, RolloutResult
from tests.helpers import gone_after_its_probe, idle_model_url, rollout
from tests.stub_server import wait_until


@pytest.fixture(scope="module")
async def deadlines(backend: LocalBackend) -> dict[str, RolloutResult]:
    """The two rollouts that wait for a deadline, waiting together (they share nothing but the backend: each its own
    sandbox, scripted model and deadline). The deadline cut goes first: its deadline leaves OpenCode time to boot and
    call even when other rollouts share the cores (the sixteen-rollout test runs alone), and the tight total deadline
    starts once that call is in, so its OpenCode's boot is not in the cut's way; the cut's answer streams for 80 s, so
    its deadline always lands inside it. Both are over before a test reads them, so each test's leak check holds."""
    streaming = Script(steps=[Step(content="word " * 800, token_delay_s=0.1)])
    with ScriptedModelServer(streaming) as slow, ScriptedModelServer(Script(steps=[stall(300)])) as stalled:
        cut_request = demo_request(slow.base_url, task_id="deadline_cut", agent_timeout_s=35, verify=["true"])
        cut = asyncio.ensure_future(run_rollout(cut_request, backend))
        try:
            await wait_until(lambda: bool(slow.exchanges) or cut.done(), 120)
            tight = demo_request(
                stalled.base_url,
                task_id="tight_total",
                total_timeout_s=40,
                agent_timeout_s=600,
                verify=["true"],
                verify_timeout_s=5,
            )
            results = await asyncio.gather(cut, run_rollout(tight, backend))
        finally:
            if not cut.done():
                cut.cancel()
                await asyncio.wait([cut])
    return {result.task_id: result for result in results}


@pytest.mark.timeout(240)
async def test_a_tight_total_deadline_still_leaves_verify_its_time(
    deadlines: dict[str, RolloutResult], no_leaks: None
) -> None:
    result = deadlines["tight_total"]
    assert (result.status, result.failed_phase) == ("agent_timeout", "agent"), result.error
    assert [r.exit_code for r in result.verify_results] == [0]
    assert result.reward == 1.0


async def test_a_task_id_that_looks_like_a_flag_is_only_a_title(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, Script(steps=[say("ok")]), task_id="-rf", verify=["true"])
    assert outcome.result.status == "completed", outcome.result.error
    assert outcome.result.task_id == "-rf"
    assert outcome.exchanges, "OpenCode ran and called the model"


@pytest.mark.timeout(240)
async def test_a_turn_our_deadline_cut_is_labelled_and_the_status_stays_agent_timeout(
    deadlines: dict[str, RolloutResult], no_leaks: None
) -> None:
    result = deadlines["deadline_cut"]
    assert (result.status, result.failed_phase) == ("agent_timeout", "agent"), result.error
    assert result.proxy_turns, f"no turn recorded before the 35 s deadline; proxy log: {result.proxy_log_tail}"
    assert result.proxy_turns[-1].outcome == "cut_by_deadline"
    assert result.reward == 1.0


async def test_a_context_overflow_says_so_and_keeps_the_reward(backend: LocalBackend, no_leaks: None) -> None:
    message = (
        "This model's maximum context length is 32768 tokens. "
        "However, your prompt contains at least 40000 input tokens."
    )
    outcome = await rollout(backend, Script(steps=[fail(400, message=message)]), verify=["true"])
    result = outcome.result
    assert (result.status, result.failed_phase) == ("agent_error", "agent"), result.error
    assert "exceeded the model's context" in (result.error or "")
    assert result.reward == 1.0


def test_opencodes_compaction_call_is_auxiliary_even_with_tools() -> None:
    body = {
        "tools": [{"type": "function", "function": {"name": "bash"}}],
        "messages": [{"role": "system", "content": "You are a context summarization agent. Summarize ..."}],
    }
    assert turn_kind(body, {}) == "auxiliary"
    body["messages"] = [{"role": "system", "content": "You are opencode, an interactive CLI tool"}]
    assert turn_kind(body, {}) == "agent"


async def test_a_dead_upstream_stops_the_agent_after_a_few_calls(backend: LocalBackend, no_leaks: None) -> None:
    request = await gone_after_its_probe(agent_timeout_s=300, upstream_max_unreachable=2, verify=["true"])
    result = await run_rollout(request, backend)
    assert (result.status, result.failed_phase) == ("upstream_error", "agent"), result.error
    assert [turn.outcome for turn in result.proxy_turns] == ["unreachable", "unreachable"]
    assert "could not connect" in (result.proxy_turns[-1].upstream_error or "")
    assert result.agent_exit_code == 1
    assert result.reward is None


async def test_a_long_run_of_5xx_stops_the_agent_at_its_own_threshold(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(
        backend, Script(steps=[fail(503)] * 10), agent_timeout_s=300, upstream_max_server_errors=3, verify=[]
    )
    result = outcome.result
    assert result.status == "upstream_error", result.error
    assert [turn.upstream_status for turn in result.proxy_turns] == [503, 503, 503]
    assert "consecutive 5xx" in (result.proxy_turns[-1].upstream_error or "")


async def test_a_result_carries_the_task_it_ran_without_its_key() -> None:
    request = RolloutRequest(
        base_url=idle_model_url(),
        model="m",
        api_key="sk-never-in-a-result",
        instruction="do it",
        verify=["true"],
    )
    result = await run_rollout(request, StubBackend())
    assert result.task is not None
    assert (result.task.instruction, result.task.verify, result.task.api_key) == ("do it", ["true"], "")
    assert "sk-never-in-a-result" not in result.model_dump_json()
    again = RolloutResult.model_validate_json(result.model_dump_json())
    assert again.task == result.task


class _RemovalEnds(StubBackend):
    """Stub sandboxes whose removal of OpenCode's project configuration (our step, as root) ends as `ending` says."""

    def __init__(self, ending: CommandResult) -> None:
        super().__init__()
        self._ending = ending

    async def create(self, spec: SandboxSpec) -> StubSandbox:
        sandbox = await super().create(spec)
        plain, ending = sandbox.run, self._ending

        async def run(cmd: str, **options: Any) -> CommandResult:
            if cmd.startswith(project_config_removal_command(WORKDIR)):
                return ending.model_copy(update={"cmd": cmd})
            return await plain(cmd, **options)

        sandbox.run = run  # type: ignore[method-assign]
        return sandbox


@pytest.mark.parametrize(
    ("ending", "status"),
    [
        (CommandResult(cmd="", exit_code=-1, timed_out=True, duration_s=30.0), "sandbox_error"),
        (CommandResult(cmd="", exit_code=1, stderr="rm: cannot remove"), "setup_failed"),
    ],
)
async def test_our_removal_of_project_config_timing_out_is_ours_and_failing_is_the_tasks(
    ending: CommandResult, status: str
) -> None:
    request = RolloutRequest(base_url=idle_model_url(), model="m", instruction="do it", verify=["true"])
    result = await run_rollout(request, _RemovalEnds(ending))
    assert (result.status, result.failed_phase) == (status, "setup"), result.error
    assert ("our step" in (result.error or "")) == (status == "sandbox_error")
