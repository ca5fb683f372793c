"""The viewer page as text: one self-contained file, hostile content embedded inertly, the CLI that writes it, and
the training sequences it embeds (computed by opencode_env.training, drawn by the page)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from opencode_env.cli import main
from opencode_env.viewer import render_page
from opencode_env.viewer.page import SequenceSegment, TrainingView, training_view
from opencode_env.wire import CommandResult, MessagesBase, RolloutResult, RolloutTurn

HOSTILE = "</script><script>alert(1)</script><!-- <img src=x onerror=alert(2)> & \u2028"


def hostile_result() -> RolloutResult:
    return RolloutResult(
        task_id="hostile",
        status="completed",
        reward=0.5,
        files={"</script>.py": HOSTILE},
        verify_results=[CommandResult(cmd=HOSTILE, exit_code=1, stdout=HOSTILE)],
        proxy_turns=[
            RolloutTurn(turn=0, completion_tokens=[HOSTILE], per_token_logps=[-0.1], completion_token_ids=[7])
        ],
        agent_final_text=HOSTILE,
    )


def forking_result() -> RolloutResult:
    """Turn 1 extends turn 0; turn 2's prompt drifts at position 2 (same messages: the template's doing); turn 3 has
    no prompt ids (skipped), so turn 4 starts a sequence after it; turn 5 is not OpenCode's (unattributed)."""
    user = {"role": "user", "content": "fix add.py"}
    first = {"role": "assistant", "content": "reading"}
    tool = {"role": "tool", "content": "def add(a, b): ..."}

    def agent(number: int, prompt: list[int], completion: list[int], messages: list[dict[str, str]]) -> RolloutTurn:
        return RolloutTurn(
            turn=number,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_tokens=[f"t{token}" for token in completion],
            per_token_logps=[-0.25] * len(completion),
            aligned=True,
            token_id_source="return_token_ids",
            request={"messages": messages},
        )

    turns = [
        agent(0, [1, 2, 3], [10, 11], [user]),
        agent(1, [1, 2, 3, 10, 11, 20, 21], [12], [user, first, tool]),
        agent(2, [1, 2, 9, 10, 11, 20, 21, 12, 22], [13, 14], [user, first, tool, first, tool]),
        agent(3, [], [15], [user]),
        agent(4, [1, 2, 3, 10, 11, 20, 21, 12, 23], [16, 17, 18], [user]),
        RolloutTurn(turn=5, kind="unattributed", completion_token_ids=[5], completion_tokens=["x"]),
    ]
    return RolloutResult(task_id="forks", reward=1.0, proxy_turns=turns)


def embedded_data(page: str, block: str = "rollout-data") -> str:
    match = re.search(rf'<script type="application/json" id="{block}">(.*?)</script>', page, re.S)
    assert match is not None
    return match.group(1)


def test_hostile_text_cannot_close_the_data_block_and_round_trips() -> None:
    result = hostile_result()
    page = render_page(result)
    data = embedded_data(page)
    assert "<" not in data
    assert ">" not in data
    assert RolloutResult.model_validate(json.loads(data)) == result
    assert page.count("<script") == 3
    training = embedded_data(page, "training-data")
    assert "<" not in training
    assert ">" not in training
    assert TrainingView.model_validate(json.loads(training)).summary is not None


def test_the_page_embeds_each_sequences_shape_its_forks_and_skipped_turns() -> None:
    page = render_page(forking_result())
    view = json.loads(embedded_data(page, "training-data"))
    assert [(s["sequence"]["turns"], s["sequence"]["started"]) for s in view["sequences"]] == [
        ([0, 1], "first"),
        ([2], "drift"),
        ([4], "after_unusable_turn"),
    ]
    assert all("prompt_ids" not in s["sequence"] and "env_mask" not in s["sequence"] for s in view["sequences"])
    assert [s["trl_row"] for s in view["sequences"]] == [False, False, True]
    fork = view["summary"]["forks"][0]
    assert (fork["turn"], fork["sequence"], fork["position"], fork["cause"]) == (2, 0, 2, "template_drift")
    assert view["summary"]["skipped"] == [{"turn": 3, "reason": "no engine prompt ids"}]
    assert view["summary"]["unattributed"] == [5]


def test_a_sequence_is_drawn_as_its_prompt_then_per_turn_environment_and_model_tokens() -> None:
    first = training_view(forking_result()).sequences[0]
    assert (first.prompt_tokens, first.model_tokens, first.environment_tokens) == (3, 3, 2)
    assert first.segments == [
        SequenceSegment(turn=0, environment_tokens=0, model_tokens=2),
        SequenceSegment(turn=1, environment_tokens=2, model_tokens=1),
    ]
    assert first.mean_logprob == -0.25


def test_a_result_whose_references_are_broken_still_gets_a_page() -> None:
    result = forking_result()
    result.proxy_turns[2].messages_base = MessagesBase(turn=99, count=1)
    view = training_view(result)
    assert view.unavailable is not None
    assert "99" in view.unavailable
    assert "training-data" in render_page(result)


def test_the_page_loads_nothing_from_anywhere() -> None:
    page = render_page(hostile_result())
    without_data = page.replace(embedded_data(page), "")
    assert "http://" not in without_data
    assert "https://" not in without_data
    assert "default-src 'none'" in page
    assert "connect-src 'none'" in page


def test_view_command_writes_the_page(tmp_path: Path, capsys) -> None:
    source = tmp_path / "result.json"
    source.write_text(hostile_result().model_dump_json())
    assert main(["view", str(source)]) == 0
    written = tmp_path / "result.html"
    assert capsys.readouterr().out.strip() == str(written)
    assert "rollout-data" in written.read_text()


def test_view_command_names_what_is_wrong_with_a_bad_file(tmp_path: Path, capsys) -> None:
    source = tmp_path / "bad.json"
    source.write_text(json.dumps({"task_id": "t", "status": "completed", "reward": "lots"}))
    assert main(["view", str(source), "--out", str(tmp_path / "x.html")]) == 2
    assert "reward" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
    assert main(["view", str(tmp_path / "missing.json")]) == 2
