"""The settings as the command line and a starting server show them, each a real process (the settings' own rules
are in tests/unit/test_settings.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_shows_sources_and_never_a_secret() -> None:
    env = {**os.environ, "E2B_API_KEY": "e2b_secret_9d2f", "OPENCODE_ENV_TOKEN": "tok-secret-1c", "PORT": "8123"}
    shown = subprocess.run(
        [sys.executable, "-m", "opencode_env.cli", "settings"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "e2b_secret_9d2f" not in shown
    assert "tok-secret-1c" not in shown
    lines = {line.split()[0]: line for line in shown.splitlines()}
    assert lines["E2B_API_KEY"].endswith("(set, hidden)  (environment)")
    assert lines["PORT"].split()[1:] == ["8123", "(environment)"]
    assert lines["OPENCODE_ENV_RESULTS_KEEP"].split()[1:] == ["200", "(default)"]


def test_an_unknown_variable_is_warned_about_at_start_naming_the_closest() -> None:
    env = {**os.environ, "OPENCODE_ENV_MAX_CPU": "4", "OPENCODE_ENV_XYZZY": "1", "OPENCODE_ENV_TOKEN": "t"}
    ran = subprocess.run(
        [sys.executable, "-m", "opencode_env.cli", "settings"], env=env, capture_output=True, text=True, check=True
    )
    warnings = [line for line in ran.stderr.splitlines() if "warning:" in line]
    assert warnings == [
        "opencode-env: warning: OPENCODE_ENV_MAX_CPU is not a setting and is ignored "
        "(did you mean OPENCODE_ENV_MAX_CPUS?)",
        "opencode-env: warning: OPENCODE_ENV_XYZZY is not a setting and is ignored "
        "(`opencode-env settings` lists every setting)",
    ]
    quiet = {**os.environ, "OPENCODE_ENV_UPSTREAM_KEY": "k", "OPENCODE_ENV_MAX_CPUS": "2"}
    ran = subprocess.run(
        [sys.executable, "-m", "opencode_env.cli", "settings"], env=quiet, capture_output=True, text=True, check=True
    )
    assert "warning:" not in ran.stderr
