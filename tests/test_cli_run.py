"""`opencode-env run` as a user meets it: a request the pipeline refuses is a CLI error (stderr, exit 2, the flags
to pass), and --out keeps stdout for the summary's reader."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from opencode_env.cli import build_parser
from opencode_env.wire.models import RolloutResult


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
