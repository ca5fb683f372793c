"""OpenCode's allow-listed environment on a cloud VM (sandbox/cloud/agent_env.py), run by real shells: every
exported variable off the list is unset before the command, values never pass through argv, and a value that looks
like another variable (a newline, then NAME=...) neither smuggles a name in nor keeps one alive."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from opencode_env.sandbox.cloud.agent_env import allow_listed, env_file_text, split_agent_env, tool_shell

VM_ENV = {
    "PATH": "/usr/bin:/bin",
    "OPENCODE_CONFIG": "/ours.json",
    "NODE_OPTIONS": "--require /evil.js",
    "LD_PRELOAD": "/evil.so",
    "OPENCODE_CONFIG_CONTENT_X": "not-ours",
    "SMUGGLER": "x\nOPENCODE_CONFIG=/evil.json",
}


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_only_allowed_names_reach_the_command(shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    command = allow_listed("env", ["PATH", "OPENCODE_CONFIG"])
    ran = subprocess.run([shell, "-c", command], env=VM_ENV, capture_output=True, text=True, check=True)
    names = {line.split("=", 1)[0] for line in ran.stdout.splitlines() if "=" in line}
    assert names - {"_", "SHLVL", "PWD", "OLDPWD"} == {"PATH", "OPENCODE_CONFIG"}
    assert "OPENCODE_CONFIG=/ours.json" in ran.stdout.splitlines()
    assert "/ours.json" not in command


def test_the_tools_shell_gives_the_task_env_and_none_of_opencodes(tmp_path: Path) -> None:
    own, tools = split_agent_env({"OPENCODE_ENV_UPSTREAM_KEY": "secret", "OPENCODE_CONFIG": "/c", "TASK": "a 'b' $c"})
    assert set(own) == {"OPENCODE_ENV_UPSTREAM_KEY", "OPENCODE_CONFIG"}
    directory = tmp_path
    (directory / "env").write_text(env_file_text(tools))
    (directory / "bash").write_text(tool_shell(str(directory / "env"), own))
    (directory / "bash").chmod(0o755)
    ran = subprocess.run(
        [str(directory / "bash"), "-c", "env"],
        env={"PATH": "/usr/bin:/bin", **own},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "TASK=a 'b' $c" in ran.stdout.splitlines()
    assert "secret" not in ran.stdout
    assert "OPENCODE_CONFIG" not in ran.stdout
