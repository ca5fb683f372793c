"""Step samples, sub-agent sequences and coverage: hand-built rollouts, and `opencode-env export` as users run it."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.training import (
    Coverage,
    sequences_coverage,
    steps_coverage,
    training_sequences,
    training_steps,
    training_steps_batch,
    training_summary,
    trl_row_coverage,
)
from opencode_env.training.formats import training_rows, trl_batch
from opencode_env.wire import RolloutResult, RolloutTurn, TurnKind
from opencode_env.wire.steps import StepResult
from tests.integration.test_training import history, result_of, turn

EOS = 99
ROOT, CHILD, OTHER_CHILD = "ses_root", "ses_child", "ses_other_child"


def thinking_rollout(turns: int = 14, reasoning: int = 300, answer: int = 80, tool_output: int = 7) -> RolloutResult:
    """Each turn generates reasoning then an answer; the chat template renders the history without the reasoning,
    as Qwen3's does, so every later prompt leaves the previous turn's generated ids: every turn forks."""
    rendered = [1, 2, 3]
    records = []
    for number in range(turns):
        thought = [10_000 + number * 1000 + k for k in range(reasoning)]
        said = [20_000 + number * 1000 + k for k in range(answer)] + [EOS]
        records.append(turn(number, list(rendered), thought + said, messages=history(number)))
        rendered += said + [30_000 + number * 1000 + k for k in range(tool_output)]
    return result_of(*records)


def in_session(record: RolloutTurn, session: str, parent: str | None = None) -> RolloutTurn:
    return record.model_copy(update={"session_id": session, "parent_session_id": parent})


def with_sub_agents() -> RolloutResult:
    """The root agent's two turns around a task tool call whose sub-agent runs two turns; a second sub-agent whose
    prompt happens to extend the first's ids; a title call."""
    sub: TurnKind = "sub_agent"
    return result_of(
        in_session(turn(0, [1, 2, 3], [10, EOS], messages=history(0)), ROOT),
        in_session(turn(1, [400, 401], [402, 403, EOS], kind=sub), CHILD, ROOT),
        in_session(turn(2, [400, 401, 402, 403, EOS, 404], [405, EOS], kind=sub), CHILD, ROOT),
        in_session(turn(3, [400, 401, 402], [406, EOS], kind=sub), OTHER_CHILD, ROOT),
        in_session(turn(4, [7, 8], [9, 9, 9, EOS], kind="auxiliary"), ROOT),
        in_session(turn(5, [1, 2, 3, 10, EOS, 50], [11, 12, EOS], messages=history(1)), ROOT),
    )


def test_every_turn_of_a_thinking_rollout_forks_and_its_steps_carry_every_agent_token() -> None:
    result = thinking_rollout()
    found = training_sequences(result)
    assert len(found.forks) == 13
    assert {fork.cause for fork in found.forks} == {"template_drift"}
    steps = training_steps(result)
    assert [step.turn for step in steps] == list(range(14))
    for step, record in zip(steps, result.proxy_turns, strict=True):
        assert step.prompt_ids == record.prompt_token_ids
        assert step.completion_ids == record.completion_token_ids
        assert step.logprobs == record.per_token_logps
        assert step.env_mask == [1] * 381
        assert (step.kind, step.session_turn_index, step.usable, step.problem) == ("agent", step.turn, True, None)
        assert (step.reward, step.status, step.task_id) == (1.0, "completed", "t1")
    assert sum(len(step.completion_ids) for step in steps) == 14 * 381
    covered = steps_coverage(result, steps)
    assert (covered.agent_tokens, covered.covered_tokens, covered.fraction, covered.left_out) == (5334, 5334, 1.0, {})
    assert sequences_coverage(result).covered_tokens == 5334


def test_the_trl_row_of_a_thinking_rollout_states_its_low_coverage() -> None:
    result = thinking_rollout()
    [row] = training_rows([result], filler_token_id=EOS)
    assert row.turns == [13]
    assert (row.covered_tokens, row.agent_tokens) == (381, 5334)
    assert sum(row.env_mask) == row.covered_tokens
    assert row.dropped_turns == list(range(13))
    batch = trl_batch([result], filler_token_id=EOS)
    assert (batch["covered_tokens"], batch["agent_tokens"]) == ([381], [5334])
    covered = trl_row_coverage(result)
    assert (covered.covered_turns, covered.turns) == (1, 14)
    assert sorted(covered.left_out) == list(range(13))
    assert "not the final one" in covered.left_out[0]
    text = training_summary(result).text()
    assert (
        "coverage:   trl row 381 of 5,334 agent tokens (7.1%, 1 of 14 turns); "
        "sequences 5,334 of 5,334 agent tokens (100.0%, 14 of 14 turns); "
        "steps 5,334 of 5,334 agent tokens (100.0%, 14 of 14 turns)"
    ) in text


def test_sub_agent_sessions_form_their_own_sequences_with_their_parent() -> None:
    result = with_sub_agents()
    found = training_sequences(result)
    assert found.forks == []
    assert [(s.kind, s.session_id, s.parent_session_id, s.turns) for s in found.sequences] == [
        ("agent", ROOT, None, [0, 5]),
        ("sub_agent", CHILD, ROOT, [1, 2]),
        ("sub_agent", OTHER_CHILD, ROOT, [3]),
    ]
    child = found.sequences[1]
    assert (child.prompt_ids, child.completion_ids, child.env_mask) == (
        [400, 401],
        [402, 403, EOS, 404, 405, EOS],
        [1, 1, 1, 0, 1, 1],
    )
    assert found.final() is found.sequences[0]
    [row] = training_rows([result], filler_token_id=EOS)
    assert (row.kind, row.turns, row.dropped_turns) == ("agent", [0, 5], [1, 2, 3])
    assert (row.covered_tokens, row.agent_tokens) == (5, 12)
    rows = training_rows([result], every_sequence=True)
    assert [(r.kind, r.session_id, r.parent_session_id, r.covered_tokens) for r in rows] == [
        ("agent", ROOT, None, 5),
        ("sub_agent", CHILD, ROOT, 5),
        ("sub_agent", OTHER_CHILD, ROOT, 2),
    ]
    left_out = trl_row_coverage(result).left_out
    assert set(left_out) == {1, 2, 3}
    assert "sub-agent" in left_out[1]
    summary = training_summary(result)
    assert "sequences:  3 (2 of sub-agents)" in summary.text()
    assert summary.coverage.sequences.covered_tokens == 12
    assert summary.coverage.trl_row.auxiliary_tokens == 4


def test_steps_name_their_session_and_their_place_in_it() -> None:
    steps = training_steps(with_sub_agents(), rollout_index=3)
    assert [(s.turn, s.kind, s.session_id, s.parent_session_id, s.session_turn_index) for s in steps] == [
        (0, "agent", ROOT, None, 0),
        (1, "sub_agent", CHILD, ROOT, 0),
        (2, "sub_agent", CHILD, ROOT, 1),
        (3, "sub_agent", OTHER_CHILD, ROOT, 0),
        (5, "agent", ROOT, None, 1),
    ]
    assert {s.rollout_index for s in steps} == {3}
    batch = training_steps_batch([thinking_rollout(turns=2), with_sub_agents()])
    assert [s.rollout_index for s in batch] == [0, 0, 1, 1, 1, 1, 1]


def test_an_infrastructure_failure_makes_every_step_unusable_and_the_coverage_says_why() -> None:
    result = result_of(*thinking_rollout(turns=3).proxy_turns, status="proxy_error", reward=None)
    result.error = "the capture proxy died"
    steps = training_steps(result)
    assert [s.usable for s in steps] == [False] * 3
    assert all("proxy_error: the capture proxy died" in (s.problem or "") for s in steps)
    assert all(set(s.env_mask) == {0} and s.reward is None for s in steps)
    covered = steps_coverage(result, steps)
    assert (covered.covered_tokens, covered.agent_tokens, covered.fraction) == (0, 3 * 381, 0.0)
    assert sorted(covered.left_out) == [0, 1, 2]
    assert "coverage:   trl row 0 of 1,143 agent tokens (0.0%, 0 of 3 turns)" in training_summary(result).text()


def test_a_misaligned_turn_is_an_unusable_step_and_left_out_by_name() -> None:
    records = list(thinking_rollout(turns=3, reasoning=2, answer=2).proxy_turns)
    records[1] = records[1].model_copy(update={"per_token_logps": records[1].per_token_logps[:-1]})
    result = result_of(*records)
    steps = training_steps(result)
    assert [s.usable for s in steps] == [True, False, True]
    assert steps[1].problem == "5 ids but 4 logprobs"
    assert steps[1].env_mask == [0] * 5
    covered = steps_coverage(result, steps)
    assert (covered.covered_tokens, covered.agent_tokens, covered.left_out) == (10, 15, {1: "5 ids but 4 logprobs"})
    assert sequences_coverage(result).left_out == {1: "5 ids but 4 logprobs"}


def test_auxiliary_unattributed_and_failed_calls_are_no_agent_tokens() -> None:
    result = result_of(
        turn(0, [1, 2], [10, EOS]),
        turn(1, [7], [8, 8, 8, EOS], kind="auxiliary"),
        turn(2, [1, 2, 10, EOS, 5], [6, 6, EOS], kind="unattributed"),
        turn(3, [1, 2, 10, EOS, 5], [11], outcome="client_disconnected"),
    )
    covered = steps_coverage(result)
    assert (covered.agent_tokens, covered.turns, covered.auxiliary_tokens, covered.unattributed_tokens) == (2, 1, 4, 3)
    assert [step.turn for step in training_steps(result)] == [0]


def test_a_turn_without_ids_still_counts_its_generated_tokens_as_left_out() -> None:
    result = result_of(turn(0, [1, 2], [10, 11, EOS], ids=False))
    covered = steps_coverage(result)
    assert (covered.agent_tokens, covered.covered_tokens, covered.left_out) == (3, 0, {0: "no engine prompt ids"})
    assert covered.text() == "0 of 3 agent tokens (0.0%, 0 of 1 turns)"


def test_coverage_never_rounds_up_to_a_whole() -> None:
    nearly = Coverage(export="steps", agent_tokens=10_000, covered_tokens=9_999, turns=2, covered_turns=1)
    assert nearly.text() == "9,999 of 10,000 agent tokens (99.9%, 1 of 2 turns)"
    assert Coverage(export="steps").text() == "no agent tokens (0 turns)"
    assert Coverage(export="steps").fraction is None


def test_the_summary_prints_the_results_warnings() -> None:
    result = result_of(turn(0, [1, 2], [10, EOS]))
    result.warnings = ["logprobs may not be the sampler's"]
    summary = training_summary(result)
    assert summary.warnings == ["logprobs may not be the sampler's"]
    assert "warning:    logprobs may not be the sampler's" in summary.text().splitlines()


def in_task_steps(result: RolloutResult, *bounds: int) -> RolloutResult:
    """The rollout as a multi-step task's: step k's agent made proxy_turns[bounds[k]:bounds[k + 1]]."""
    steps = [
        StepResult(name=f"step-{index}", status="completed", first_turn=start, end_turn=end)
        for index, (start, end) in enumerate(itertools.pairwise(bounds))
    ]
    return result.model_copy(update={"steps": steps})


def test_a_later_task_steps_agent_starts_its_own_sequence_even_when_its_ids_extend_the_last() -> None:
    """Step two's agent is a new session: its first call starts a sequence (`step`), no fork is recorded, and its
    calls are counted from 0, even when its prompt ids happen to extend step one's sequence."""
    result = in_task_steps(
        result_of(
            in_session(turn(0, [1, 2, 3], [10, EOS]), "ses_one"),
            in_session(turn(1, [1, 2, 3, 10, EOS, 50], [11, EOS]), "ses_one"),
            in_session(turn(2, [1, 2, 3, 10, EOS, 50, 11, EOS], [12, EOS]), "ses_two"),
            in_session(turn(3, [1, 2, 3, 10, EOS, 50, 11, EOS, 12, EOS, 51], [13, EOS]), "ses_two"),
        ),
        0,
        2,
        4,
    )
    found = training_sequences(result)
    assert found.forks == []
    assert [(s.turns, s.started, s.session_id) for s in found.sequences] == [
        ([0, 1], "first", "ses_one"),
        ([2, 3], "step", "ses_two"),
    ]
    assert [(s.turn, s.session_id, s.session_turn_index) for s in training_steps(result)] == [
        (0, "ses_one", 0),
        (1, "ses_one", 1),
        (2, "ses_two", 0),
        (3, "ses_two", 1),
    ]


@settings(max_examples=300, deadline=None)
@given(
    extends=st.lists(st.booleans(), min_size=1, max_size=12),
    cuts=st.sets(st.integers(min_value=1, max_value=11), max_size=4),
)
def test_no_sequence_and_no_session_count_crosses_a_task_step(extends: list[bool], cuts: set[int]) -> None:
    """Over any run of calls (each extending the conversation so far or not) and any step boundaries: every
    sequence's calls are one step's, a step's first call is never a fork, and each step's calls count from 0."""
    conversation: list[int] = [1, 2, 3]
    records = []
    for number, extend in enumerate(extends):
        prompt = [*conversation, 50 + number] if extend else [7, number]
        completion = [100 + number, EOS]
        records.append(turn(number, prompt, completion))
        conversation = prompt + completion
    bounds = [0, *sorted(cut for cut in cuts if cut < len(extends)), len(extends)]
    result = in_task_steps(result_of(*records), *bounds)
    step_of = {number: index for index, (a, b) in enumerate(itertools.pairwise(bounds)) for number in range(a, b)}

    found = training_sequences(result)
    for sequence in found.sequences:
        assert len({step_of[number] for number in sequence.turns}) == 1, (sequence.turns, bounds)
        assert (sequence.started == "step") == (sequence.turns[0] in bounds[1:-1])
    assert not {fork.turn for fork in found.forks} & set(bounds)
    counted = [(step_of[s.turn], s.session_turn_index) for s in training_steps(result)]
    assert counted == [(step, number - bounds[step]) for number, step in sorted(step_of.items())]
