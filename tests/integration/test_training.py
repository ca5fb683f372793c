"""Training sequences: hand-built rollouts for each rule, then real rollouts (OpenCode, proxy, scripted model).

The four real rollouts share nothing, as each one's request or model is what another test asserts the absence of:
the three-turn rollout must have no fork and only agent calls, the reasoning one must fork (a script with reasoning),
the call-without-tools one needs E2B (the local backend refuses the agent's own model call) and adds an unattributed
call, the no-ids one needs a model without token ids. The no-ids rollout is one answer without a tool: its reason is
the turns' missing ids, whatever the agent did.
"""

from __future__ import annotations

from typing import Any

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash, demo_script, say
from opencode_env.training.sequences import training_sequences, training_summary
from opencode_env.wire import RolloutResult, RolloutStatus, RolloutTurn, TurnKind
from tests.helpers import rollout

SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "do it"}


def turn(
    number: int,
    prompt: list[int],
    completion: list[int],
    *,
    messages: list[dict[str, Any]] | None = None,
    kind: TurnKind = "agent",
    outcome: str = "complete",
    ids: bool = True,
) -> RolloutTurn:
    return RolloutTurn(
        turn=number,
        prompt_token_ids=prompt if ids else [],
        completion_token_ids=completion if ids else [],
        completion_tokens=[f"t{token}" for token in completion],
        per_token_logps=[-0.5 - token / 1000 for token in completion],
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
        aligned=ids,
        token_id_source="return_token_ids" if ids else "none",
        kind=kind,
        outcome=outcome,
        request={"messages": messages if messages is not None else [SYSTEM, USER]},
    )


def result_of(*turns: RolloutTurn, status: RolloutStatus = "completed", reward: float | None = 1.0) -> RolloutResult:
    return RolloutResult(task_id="t1", status=status, reward=reward, proxy_turns=list(turns))


def history(count: int) -> list[dict[str, Any]]:
    """An append-only conversation: system, user, then `count` assistant/tool pairs."""
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    for index in range(count):
        messages += [{"role": "assistant", "content": f"a{index}"}, {"role": "tool", "content": f"o{index}"}]
    return messages


def test_three_extending_turns_make_one_sequence_with_the_suffixes_masked() -> None:
    result = result_of(
        turn(0, [1, 2, 3], [10, 11, 99], messages=history(0)),
        turn(1, [1, 2, 3, 10, 11, 99, 50, 51], [12, 99], messages=history(1)),
        turn(2, [1, 2, 3, 10, 11, 99, 50, 51, 12, 99, 52], [13, 14, 99], messages=history(2)),
    )
    found = training_sequences(result)
    assert (found.forks, found.skipped, found.no_sequences_reason) == ([], [], None)
    [sequence] = found.sequences
    assert sequence.prompt_ids == [1, 2, 3]
    assert sequence.completion_ids == [10, 11, 99, 50, 51, 12, 99, 52, 13, 14, 99]
    assert sequence.env_mask == [1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1]
    model_logprobs = [lp for t in result.proxy_turns for lp in t.per_token_logps]
    assert [lp for lp, m in zip(sequence.logprobs, sequence.env_mask, strict=True) if m] == model_logprobs
    assert [lp for lp, m in zip(sequence.logprobs, sequence.env_mask, strict=True) if not m] == [0.0] * 3
    last = result.proxy_turns[-1]
    assert sequence.prompt_ids + sequence.completion_ids == last.prompt_token_ids + last.completion_token_ids
    assert (sequence.turns, sequence.started, sequence.reward, sequence.task_id) == ([0, 1, 2], "first", 1.0, "t1")
    assert sequence.usable


def test_a_prompt_that_does_not_extend_forks_with_the_position_and_both_ids() -> None:
    result = result_of(
        turn(0, [1, 2, 3], [7, 8, 99], messages=history(0)),
        turn(1, [1, 2, 3, 8, 99, 50], [12, 99], messages=history(1)),
        turn(2, [1, 2, 3, 8, 99, 50, 12, 99, 51], [13, 99], messages=history(2)),
    )
    found = training_sequences(result)
    assert [s.turns for s in found.sequences] == [[0], [1, 2]]
    assert [s.started for s in found.sequences] == ["first", "drift"]
    [fork] = found.forks
    assert (fork.turn, fork.sequence, fork.position, fork.sequence_id, fork.prompt_id) == (1, 0, 3, 7, 8)
    assert fork.cause == "template_drift"
    assert found.final() == found.sequences[1]
    assert found.sequences[1].env_mask == [1, 1, 0, 1, 1]


def test_a_rewritten_history_is_named_and_an_interleaved_conversation_resumes() -> None:
    compacted = [SYSTEM, {"role": "user", "content": "summary of the work so far"}]
    result = result_of(
        turn(0, [1, 2, 3], [10, 99], messages=history(0)),
        turn(1, [1, 5], [20, 99], messages=compacted),
        turn(2, [1, 2, 3, 10, 99, 50], [11, 99], messages=history(1)),
    )
    found = training_sequences(result)
    assert [s.turns for s in found.sequences] == [[0, 2], [1]]
    [fork] = found.forks
    assert (fork.turn, fork.position, fork.sequence_id, fork.prompt_id, fork.cause) == (1, 1, 2, 5, "history_rewritten")


def test_a_prompt_shorter_than_the_sequence_forks_past_its_end() -> None:
    result = result_of(turn(0, [1, 2, 3], [10, 99]), turn(1, [1, 2, 3, 10], [11, 99]))
    [fork] = training_sequences(result).forks
    assert (fork.position, fork.sequence_id, fork.prompt_id) == (4, 99, None)


def test_auxiliary_and_failed_calls_are_left_out_and_a_sub_agent_turn_is_its_own_sequence() -> None:
    result = result_of(
        turn(0, [1, 2], [10, 99]),
        turn(1, [400, 401], [402, 99], kind="auxiliary"),
        turn(2, [500], [501, 99], kind="sub_agent"),
        turn(3, [1, 2, 10, 99, 50], [], outcome="upstream_error"),
        turn(4, [1, 2, 10, 99, 50], [11, 99]),
        turn(5, [1, 2, 10, 99, 50, 11, 99, 51], [12], outcome="client_disconnected"),
    )
    found = training_sequences(result)
    root, sub_agent = found.sequences
    assert (root.kind, root.turns, sub_agent.kind, sub_agent.turns) == ("agent", [0, 4], "sub_agent", [2])
    assert root.completion_ids == [10, 99, 50, 11, 99]
    assert (found.final(), found.forks) == (root, [])
    summary = training_summary(result, found)
    assert {kind: (u.calls, u.prompt_tokens, u.completion_tokens) for kind, u in summary.usage_by_kind.items()} == {
        "agent": (2, 7, 4),
        "auxiliary": (1, 2, 2),
        "sub_agent": (1, 1, 2),
    }
    assert summary.all_aligned
    assert "sequences:  2 (1 of sub-agents)" in summary.text()


def test_no_engine_ids_give_no_sequences_and_say_why() -> None:
    result = result_of(turn(0, [1], [2], ids=False), turn(1, [1], [2], ids=False))
    found = training_sequences(result)
    assert found.sequences == []
    assert "engine token ids" in (found.no_sequences_reason or "")
    assert "vllm" in (found.no_sequences_reason or "")
    summary = training_summary(result)
    assert (summary.usable, summary.all_aligned, summary.misaligned_turns) == (False, False, [0, 1])
    assert "no sequences:" in summary.text()
    assert "black_box" in (training_sequences(RolloutResult(mode="black_box")).no_sequences_reason or "")


def test_a_turn_without_ids_cuts_the_sequence_instead_of_masking_model_tokens() -> None:
    result = result_of(
        turn(0, [1, 2], [10, 99]),
        turn(1, [1, 2, 10, 99, 50], [11, 99], ids=False),
        turn(2, [1, 2, 10, 99, 50, 11, 99, 51], [12, 99]),
    )
    found = training_sequences(result)
    assert [(s.turns, s.started) for s in found.sequences] == [([0], "first"), ([2], "after_unusable_turn")]
    assert [(s.turn, s.reason) for s in found.skipped] == [(1, "no engine prompt ids")]
    assert found.forks == []


def test_an_infrastructure_failure_marks_every_sequence_unusable() -> None:
    turns = (turn(0, [1, 2], [10, 99]), turn(1, [1, 2, 10, 99, 5], [11, 99]))
    failed = training_sequences(result_of(*turns, status="upstream_error", reward=None))
    assert [(s.usable, s.status) for s in failed.sequences] == [(False, "upstream_error")]
    assert "upstream_error" in (failed.sequences[0].unusable_reason or "")
    policy_failure = training_sequences(result_of(*turns, status="agent_timeout", reward=0.0))
    assert [(s.usable, s.reward) for s in policy_failure.sequences] == [(True, 0.0)]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


async def test_a_real_three_turn_rollout_is_one_sequence(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, demo_script(), mode="transparent_proxy")
    result, exchanges = outcome.result, outcome.exchanges
    assert result.status == "completed", result.error
    assert len(exchanges) == 3
    found = training_sequences(result)
    assert (found.forks, found.skipped) == ([], [])
    [sequence] = found.sequences
    assert sequence.prompt_ids == exchanges[0].prompt_token_ids
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    expected_logprobs: list[float] = []
    for index, exchange in enumerate(exchanges):
        if index:
            suffix = exchange.prompt_token_ids[len(exchanges[0].prompt_token_ids) + len(expected_ids) :]
            assert suffix, "each later prompt adds the tool output"
            expected_ids += suffix
            expected_mask += [0] * len(suffix)
            expected_logprobs += [0.0] * len(suffix)
        expected_ids += [t.token_id for t in exchange.tokens]
        expected_mask += [1] * len(exchange.tokens)
        expected_logprobs += [t.logprob for t in exchange.tokens]
    assert sequence.completion_ids == expected_ids
    assert sequence.env_mask == expected_mask
    assert sequence.logprobs == expected_logprobs
    last = exchanges[-1]
    assert sequence.prompt_ids + sequence.completion_ids == last.prompt_token_ids + [t.token_id for t in last.tokens]
    assert sequence.completion_ids[-1] == 151645
    assert (sequence.reward, sequence.usable, sequence.status) == (1.0, True, "completed")
    summary = training_summary(result)
    assert (summary.sequences, summary.all_aligned, summary.usage_by_kind["agent"].calls) == (1, True, 3)


async def test_a_template_that_drops_reasoning_forks_at_the_right_turn(backend: LocalBackend, no_leaks: None) -> None:
    # The toy chat template, like Qwen3's, leaves earlier reasoning out of the history it renders.
    thinking = Step(
        reasoning="I should look first",
        tool_calls=[ToolCallStep(name="bash", arguments={"command": "ls", "description": "List"})],
    )
    outcome = await rollout(backend, Script(steps=[thinking, bash("echo hi"), say("done")]), verify=[])
    result, exchanges = outcome.result, outcome.exchanges
    assert result.status == "completed", result.error
    found = training_sequences(result)
    [fork] = found.forks
    first = exchanges[0].prompt_token_ids + [t.token_id for t in exchanges[0].tokens]
    position = first_difference(first, exchanges[1].prompt_token_ids)
    assert position >= len(exchanges[0].prompt_token_ids)
    assert (fork.turn, fork.sequence, fork.position) == (result.proxy_turns[1].turn, 0, position)
    assert (fork.sequence_id, fork.prompt_id) == (first[position], exchanges[1].prompt_token_ids[position])
    assert fork.cause == "template_drift"
    assert [s.started for s in found.sequences] == ["first", "drift"]
    assert found.final() is found.sequences[1]
    assert len(found.sequences[1].turns) == 2


async def test_a_tools_own_call_never_reaches_the_sequence(e2b_fake: E2BBackend, no_leaks: None) -> None:
    # The agent's own command looks for OpenCode's token in every process's environment to call the model without
    # tools (it would be unattributed): on E2B OpenCode is another uid, so it finds none, and the sequence holds
    # OpenCode's two calls alone.
    call = (
        "python3 - <<'EOF'\n"
        "import os\n"
        "def environ(pid):\n"
        "    try:\n"
        "        return open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        return b''\n"
        "pids = filter(str.isdigit, os.listdir('/proc'))\n"
        "found = [pid for pid in pids if b'OPENCODE_ENV_UPSTREAM_KEY' in environ(pid)]\n"
        "print('KEYS FOUND', len(found))\n"
        "EOF\n"
    )
    outcome = await rollout(e2b_fake, Script(steps=[bash(call), say("done")]), verify=[])
    result = outcome.result
    assert result.status == "completed", result.error
    assert "KEYS FOUND 0" in str(outcome.exchanges[-1].request)
    assert [t.kind for t in result.proxy_turns] == ["agent", "agent"]
    [sequence] = training_sequences(result).sequences
    assert len(sequence.turns) == 2
    assert result.usage.llm_calls == 2


async def test_a_no_ids_endpoint_gives_a_clear_reason(backend: LocalBackend, no_leaks: None) -> None:
    """An OpenAI-like server (no token ids; the probe sees it and the request asks only for logprobs). One answer
    without a tool is enough: the reason is the turns' missing ids, whatever the agent did."""
    with ScriptedModelServer(Script(steps=[say("Nothing to do.")]), omit_token_ids=True) as model:
        request = demo_request(model.base_url, endpoint="openai", capture="logprobs", verify=[])
        result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert [turn.kind for turn in result.proxy_turns].count("agent") == 1
    found = training_sequences(result)
    assert found.sequences == []
    assert "token_id_source: none" in (found.no_sequences_reason or "")


def test_a_rollout_with_no_call_says_why_in_its_own_words() -> None:
    failed = RolloutResult(status="internal_error", error="nothing answers at ws://x/ws")
    assert training_sequences(failed).no_sequences_reason == (
        "no model call was recorded (status internal_error: nothing answers at ws://x/ws)"
    )
    assert training_sequences(RolloutResult(mode="black_box")).no_sequences_reason == (
        "no turns were captured (black_box mode)"
    )
    assert training_sequences(RolloutResult(oracle=True)).no_sequences_reason == "an oracle run: no model was called"
