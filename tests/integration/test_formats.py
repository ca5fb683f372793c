"""TRL rows, the OpenEnv harness export, the rollout_func builder and `opencode-env export`.

The rollout_func runs two real rollouts (each prompt once, as TRL calls it), whose rows must be real trainable rows,
and shows which rollouts run and the rows' order for a repeated prompt on the stub backend, which runs the same
pipeline around the agent without OpenCode (four real runs before, for the same properties).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencode_env.cli import main
from opencode_env.evals.trl_rollout import make_rollout_func
from opencode_env.rollout.attribution import attribute_turns
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, say, write
from opencode_env.training.formats import ORACLE_PROBLEM, harness_result, rollout_reward, training_rows, trl_batch
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_training import history, result_of, turn
from tests.stub_server import CountingBackend
from tests.unit.test_attribution import mixed_rollout

EOS = 99


def clean() -> RolloutResult:
    return result_of(
        turn(0, [1, 2, 3], [10, EOS], messages=history(0)),
        turn(1, [1, 2, 3, 10, EOS, 50], [11, EOS], messages=history(1)),
    )


def forked() -> RolloutResult:
    return result_of(
        turn(0, [1, 2, 3], [7, EOS], messages=history(0)),
        turn(1, [1, 2, 3, 8, EOS, 50], [12, EOS], messages=history(1)),
        reward=0.5,
    )


def test_trl_batch_has_the_required_keys_and_one_row_per_rollout_in_order() -> None:
    batch = trl_batch([clean(), forked()], filler_token_id=EOS)
    assert batch["prompt_ids"] == [[1, 2, 3], [1, 2, 3, 8, EOS, 50]]
    assert batch["completion_ids"] == [[10, EOS, 50, 11, EOS], [12, EOS]]
    assert batch["env_mask"] == [[1, 1, 0, 1, 1], [1, 1]]
    assert [len(lp) for lp in batch["logprobs"]] == [5, 2]
    assert batch["reward"] == [1.0, 0.5]
    assert batch["dropped_turns"] == [[], [0]]
    assert (batch["covered_tokens"], batch["agent_tokens"]) == ([4, 2], [4, 4])
    assert batch["forks"] == [0, 1]
    assert batch["usable"] == [True, True]
    assert len({len(values) for values in batch.values()}) == 1


def test_each_row_says_where_its_reward_was_graded() -> None:
    graded = clean().model_copy(update={"grade_isolation": "fresh_box"})
    batch = trl_batch([graded, forked()], filler_token_id=EOS)
    assert batch["grade_isolation"] == ["fresh_box", "none"]


def test_a_failed_rollout_keeps_a_masked_row_that_the_reward_function_leaves_unscored() -> None:
    infra = result_of(*clean().proxy_turns, status="sandbox_error", reward=None)
    nothing = result_of(status="upstream_error", reward=None)
    batch = trl_batch([clean(), infra, nothing], filler_token_id=EOS)
    assert batch["usable"] == [True, False, False]
    assert batch["env_mask"][1] == [0, 0, 0, 0, 0]
    assert batch["completion_ids"][1] == [10, EOS, 50, 11, EOS]
    assert (batch["prompt_ids"][2], batch["completion_ids"][2], batch["env_mask"][2]) == ([EOS], [EOS], [0])
    assert batch["status"] == ["completed", "sandbox_error", "upstream_error"]
    assert "sandbox_error" in batch["problem"][1]
    assert rollout_reward(batch["completion_ids"], **{k: batch[k] for k in ("reward", "usable")}) == [1.0, None, None]


def test_every_sequence_rows_carry_their_rollout_and_sequence_index() -> None:
    rows = training_rows([clean(), forked()], every_sequence=True)
    assert [(r.rollout_index, r.sequence_index, r.turns) for r in rows] == [(0, 0, [0, 1]), (1, 0, [0]), (1, 1, [1])]


def test_the_openenv_harness_result_carries_the_final_sequence() -> None:
    from openenv.core.harness import HarnessRolloutResult

    exported = harness_result(forked())
    assert isinstance(exported, HarnessRolloutResult)
    assert (exported.prompt_ids, exported.completion_ids) == ([1, 2, 3, 8, EOS, 50], [12, EOS])
    assert exported.metrics["env_reward"] == 0.5
    assert exported.metrics["env_mask"] == [1, 1]
    assert [event.type for event in exported.events] == ["fork"]
    assert exported.messages[-1]["role"] == "assistant"
    assert exported.messages[:-1] == history(1)
    assert exported.done
    failed = harness_result(result_of(status="timeout", reward=None))
    assert (failed.done, failed.completion_ids, failed.metrics["usable"]) == (False, [], False)
    assert (exported.metrics["covered_tokens"], exported.metrics["agent_tokens"]) == (2, 4)


def test_the_openenv_harness_result_lists_unattributed_turns_and_keeps_them_out_of_its_messages() -> None:
    turns = mixed_rollout()
    attribute_turns(turns)
    exported = harness_result(result_of(*turns))
    assert exported.metrics["unattributed_turns"] == [1]
    assert exported.messages[:-1] == history(1)


async def test_the_rollout_func_runs_each_prompt_and_returns_rows_in_order(backend: LocalBackend) -> None:
    # Two turns with a tool's output between them (masked): the demo without its check step, which adds nothing here.
    solution = "def add(a, b):\n    return a + b\n"
    script = Script(steps=[write("/home/user/workdir/add.py", solution), say("I wrote add.py.")])
    with ScriptedModelServer(script) as model:

        def to_request(prompt: str) -> RolloutRequest:
            return demo_request(model.base_url, task_id=prompt)

        # Each prompt once, as TRL calls it (its prompts already repeated): two real rollouts at once.
        rollout_func = make_rollout_func(InProcess(backend), to_request, max_concurrency=2)
        # Called from inside a running event loop, as in a notebook: it runs its own loop in a thread.
        batch = rollout_func(["task_a", "task_b"], object())
        # Each prompt repeated: which rollouts run and the rows' order are the pipeline's around the agent, so the
        # stub backend (no OpenCode; every rollout an agent_error row) shows them without four more real runs.
        stub = CountingBackend(command_s=0.0)
        repeated = make_rollout_func(InProcess(stub), to_request, rollouts_per_prompt=2, max_concurrency=2)
        stub_batch = repeated(["task_a", "task_b"], object())
    assert batch["task_id"] == ["task_a", "task_b"]
    assert batch["status"] == ["completed"] * 2
    assert batch["reward"] == [1.0] * 2
    for prompt_ids, completion_ids, mask in zip(
        batch["prompt_ids"], batch["completion_ids"], batch["env_mask"], strict=True
    ):
        assert prompt_ids
        assert completion_ids[-1] == 151645
        assert len(mask) == len(completion_ids)
        assert 0 in mask
    assert stub_batch["task_id"] == ["task_a", "task_a", "task_b", "task_b"]
    assert stub.created == 4
    assert len({len(values) for values in stub_batch.values()}) == 1


def test_the_rollout_func_refuses_a_bad_count(backend: LocalBackend) -> None:
    with pytest.raises(ValueError, match="rollouts_per_prompt must be at least 1"):
        make_rollout_func(InProcess(backend), RolloutRequest.model_validate, rollouts_per_prompt=0)


def test_export_writes_jsonl_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for index, result in enumerate([clean(), forked()]):
        path = tmp_path / f"r{index}.json"
        path.write_text(result.model_dump_json())
        paths.append(str(path))
    out = tmp_path / "rows.jsonl"
    assert main(["export", "--format", "sequences", *paths, "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["rollout_index"], r["sequence_index"]) for r in rows] == [(0, 0), (1, 0), (1, 1)]
    assert main(["export", "--format", "trl", *paths]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["completion_ids"] for line in captured.out.splitlines()] == [
        [10, EOS, 50, 11, EOS],
        [12, EOS],
    ]
    assert "2 rows (1 usable, 1 not; 1 of them hold under 90% of their agent tokens) from 2 rollouts" in captured.err
    assert "coverage: 6 of 8 agent tokens (75.0%, 3 of 4 turns) in the trl rows" in captured.err
    assert f"short row:  {paths[1]}: the TRL row holds 2 of 4 agent tokens" in captured.err
    assert "Fix: run with token_in='auto'" in captured.err
    assert main(["export", "--format", "trl", "--strict", *paths]) == 1
    capsys.readouterr()
    assert main(["export", "--format", "trl", "--strict", paths[0]]) == 0
    assert main(["export", "--format", "sequences", "--strict", *paths]) == 0
    assert "short row" not in capsys.readouterr().err


def test_export_leaves_oracle_runs_out_and_counts_rows_honestly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    oracle = RolloutResult(task_id="solved-by-its-solution", oracle=True, reward=1.0)
    failed = clean().model_copy(update={"status": "agent_timeout"})
    paths = []
    for index, result in enumerate([clean(), oracle, failed]):
        path = tmp_path / f"r{index}.json"
        path.write_text(result.model_dump_json())
        paths.append(str(path))
    assert main(["export", "--format", "trl", *paths]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [row["task_id"] for row in rows] == [clean().task_id, clean().task_id]
    assert "2 rows" in captured.err
    assert "from 2 rollouts (1 not completed" in captured.err
    assert "1 oracle runs left out" in captured.err
    [placeholder] = training_rows([oracle])
    assert (placeholder.usable, placeholder.problem) == (False, ORACLE_PROBLEM)


def test_export_names_a_file_that_is_not_a_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"proxy_turns": 3}')
    assert main(["export", str(bad)]) == 2
    assert f"opencode-env export: {bad} is not a RolloutResult" in capsys.readouterr().err
