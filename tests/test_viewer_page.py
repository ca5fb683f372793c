"""The viewer page as text: one self-contained file, hostile content embedded inertly, the CLI that writes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from opencode_env.cli import main
from opencode_env.viewer import render_page
from opencode_env.wire.models import CommandResult, RolloutResult, RolloutTurn

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


def embedded_data(page: str) -> str:
    match = re.search(r'<script type="application/json" id="rollout-data">(.*?)</script>', page, re.S)
    assert match is not None
    return match.group(1)


def test_hostile_text_cannot_close_the_data_block_and_round_trips() -> None:
    result = hostile_result()
    page = render_page(result)
    data = embedded_data(page)
    assert "<" not in data
    assert ">" not in data
    assert RolloutResult.model_validate(json.loads(data)) == result
    assert page.count("<script") == 2


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
    source.write_text(json.dumps({"reward": "lots"}))
    assert main(["view", str(source), "--out", str(tmp_path / "x.html")]) == 2
    assert "reward" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
    assert main(["view", str(tmp_path / "missing.json")]) == 2
