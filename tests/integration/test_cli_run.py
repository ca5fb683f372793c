"""`opencode-env run` as a user meets it: a request the pipeline refuses is a CLI error (stderr, exit 2, the flags
to pass), --out keeps stdout for the summary's reader, an oracle run needs no model, local files go into the
sandbox, and a whole request comes from a JSON file with the flags beside it winning."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from opencode_env.cli import build_parser
from opencode_env.sandbox.registry import backend_names
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import RolloutResult


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_env.cli", "run", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_without_a_model_names_the_flags(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    ran = _cli("--instruction", "x", "--out", str(out))
    assert ran.returncode == 2
    assert ran.stdout == ""
    assert "opencode-env run: base_url, model missing" in ran.stderr
    assert "--base-url and --model, or --endpoint" in ran.stderr
    assert RolloutResult.model_validate_json(out.read_text()).status == "invalid_request"


def test_every_run_flag_has_help() -> None:
    parser = build_parser()
    [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    run = commands.choices["run"]
    silent = [action.option_strings for action in run._actions if action.option_strings and not action.help]
    assert silent == []


WORKDIR = "/home/user/workdir"


def test_an_oracle_run_with_files_needs_no_model(tmp_path: Path) -> None:
    (tmp_path / "seed.txt").write_text("4")
    (tmp_path / "check.sh").write_text('test "$(cat answer.txt)" = 42\n')
    out = tmp_path / "result.json"
    ran = _cli(
        *("--instruction", "Write 42 to answer.txt", "--task-id", "cli_oracle", "--out", str(out)),
        *("--file", f"seed.txt={tmp_path / 'seed.txt'}", "--verify-file", f"tests/check.sh={tmp_path / 'check.sh'}"),
        *("--solution", "test ! -e tests/check.sh", "--solution", 'echo "$(cat seed.txt)2" > answer.txt'),
        *("--verify", f"cd {WORKDIR} && sh tests/check.sh"),
    )
    assert ran.returncode == 0, ran.stderr
    result = RolloutResult.model_validate_json(out.read_text())
    assert (result.status, result.reward, result.oracle, result.task_id) == ("completed", 1.0, True, "cli_oracle")
    assert [command.exit_code for command in result.solution_results] == [0, 0]
    assert result.files["answer.txt"] == "42\n"
    assert result.upstream.base_url == ""


def test_a_local_file_that_is_missing_or_not_text_is_a_cli_error(tmp_path: Path) -> None:
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    missing = _cli("--instruction", "x", "--solution", "true", "--file", f"a.txt={tmp_path / 'nope'}")
    assert (missing.returncode, missing.stdout) == (2, "")
    assert "argument --file: cannot read" in missing.stderr
    binary = _cli("--instruction", "x", "--solution", "true", "--verify-file", f"t.py={tmp_path / 'binary'}")
    assert (binary.returncode, binary.stdout) == (2, "")
    assert "argument --verify-file:" in binary.stderr
    assert "is not UTF-8 text" in binary.stderr
    shapeless = _cli("--instruction", "x", "--file", "a.txt")
    assert "argument --file: 'a.txt' is not PATH=LOCALFILE" in shapeless.stderr
    (tmp_path / "text").write_text("t")
    twice = _cli("--instruction", "x", *("--file", f"a={tmp_path / 'text'}") * 2)
    assert (twice.returncode, twice.stderr) == (2, "opencode-env run: --file gives a more than once\n")
    nothing = _cli("--setup", "true")
    assert nothing.returncode == 2
    assert "--instruction, --instruction-file, --task DIR or --request FILE.json" in nothing.stderr


def test_a_request_file_runs_with_the_flags_beside_it_winning(tmp_path: Path) -> None:
    secret = "sk-cli-request-file-secret"
    task = {
        "instruction": "Write 42 to answer.txt",
        "task_id": "from_file",
        "api_key": secret,
        "solution": ["echo 41 > answer.txt"],
        "verify": [f'cd {WORKDIR} && test "$(cat answer.txt)" = 41'],
        "files": {"keep.txt": "from the file"},
    }
    request_file = tmp_path / "task.json"
    request_file.write_text(json.dumps(task))
    (tmp_path / "extra.txt").write_text("from a flag")
    ran = _cli(
        *("--request", str(request_file), "--task-id", "overridden", "--file", f"extra.txt={tmp_path / 'extra.txt'}"),
        *("--verify", f'cd {WORKDIR} && test "$(cat answer.txt)" = 41 && test -f keep.txt && test -f extra.txt'),
    )
    assert ran.returncode == 0, ran.stderr
    result = RolloutResult.model_validate_json(ran.stdout)
    assert (result.task_id, result.reward, result.oracle) == ("overridden", 1.0, True)
    assert result.task is not None
    assert result.task.files == {"keep.txt": "from the file", "extra.txt": "from a flag"}
    assert secret not in ran.stdout + ran.stderr


def test_a_request_file_hands_its_key_to_the_model_and_prints_it_nowhere(tmp_path: Path, opencode_binary: Path) -> None:
    secret = "sk-cli-key-from-the-file"
    with ScriptedModelServer(demo_script()) as model:
        task = demo_request(model.base_url, api_key=secret).model_dump(mode="json")
        (tmp_path / "task.json").write_text(json.dumps(task))
        ran = _cli("--request", str(tmp_path / "task.json"), "--out", str(tmp_path / "result.json"))
        sent = {exchange.headers.get("authorization") for exchange in model.exchanges}
    assert ran.returncode == 0, ran.stderr
    assert sent == {f"Bearer {secret}"}
    saved = (tmp_path / "result.json").read_text()
    assert RolloutResult.model_validate_json(saved).reward == 1.0
    assert secret not in ran.stdout + ran.stderr + saved


def test_a_bad_request_file_is_named() -> None:
    ran = _cli("--request", str(Path(__file__)))
    assert ran.returncode == 2
    assert "argument --request:" in ran.stderr
    assert "is not JSON" in ran.stderr


def test_check_task_takes_every_registered_backend() -> None:
    parser = build_parser()
    [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    [backend] = [action for action in commands.choices["check-task"]._actions if "--backend" in action.option_strings]
    assert tuple(backend.choices or ()) == backend_names()
    assert "hf" in (backend.choices or ())


def test_the_demo_prints_its_summary_with_coverage_and_keeps_the_result(tmp_path: Path) -> None:
    """The README's first command: a completed demo, the coverage of each export, no warning (it samples from the
    model's own distribution, recorded on every turn), and the whole result on disk."""
    ran = subprocess.run(
        [sys.executable, "-m", "opencode_env.cli", "demo", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    lines = {line.split(":", 1)[0]: line for line in ran.stdout.splitlines()}
    assert lines["status"] == "status:     completed"
    assert lines["coverage"].startswith("coverage:   trl row 198 of 198 agent tokens (100.0%, 3 of 3 turns)")
    assert "warning" not in lines
    (saved,) = tmp_path.glob("demo-*.json")
    result = RolloutResult.model_validate_json(saved.read_bytes())
    assert result.warnings == []
    assert {turn.request["temperature"] for turn in result.proxy_turns} == {1.0}
    agent = [turn for turn in result.proxy_turns if turn.kind == "agent"]
    assert [turn.prompt_source for turn in agent] == ["chat_template", "forwarded_ids", "forwarded_ids"]
