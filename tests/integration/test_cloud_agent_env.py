"""OpenCode's allow-listed environment on a cloud VM (sandbox/cloud/agent_env.py), run by real shells: every
exported variable off the list is unset before the command, values never pass through argv, and a value that looks
like another variable (a newline, then NAME=...) neither smuggles a name in nor keeps one alive."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opencode_env.sandbox.cloud.agent_env import AgentRoot, allow_listed, split_agent_env, tool_broker_source

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


def start_broker(
    root: AgentRoot, tmp_path: Path, task_env: dict[str, str], *, allowed_uid: int
) -> subprocess.Popen[bytes]:
    """The real broker for `root` in `tmp_path` (its tools' shell beside it), serving `allowed_uid`, once its socket
    is there."""
    (tmp_path / "run").mkdir()
    (tmp_path / "tool_broker.py").write_text(tool_broker_source())
    me = pwd.getpwuid(os.getuid())
    config = json.loads(root.broker_config_text(user=me.pw_name, home=str(tmp_path), task_env=task_env))
    (tmp_path / "broker.json").write_text(json.dumps({**config, "allowed_uid": allowed_uid}))
    (tmp_path / "bash").write_text(root.tool_shell(sys.executable))
    (tmp_path / "bash").chmod(0o755)
    broker = subprocess.Popen(["/bin/sh", "-c", root.broker_command(sys.executable)])
    for _ in range(400):
        if Path(root.socket).exists():
            break
        time.sleep(0.05)
    return broker


def test_the_tools_shell_gives_the_task_env_and_none_of_opencodes(tmp_path: Path) -> None:
    """The real broker and client (as this test's own uid, the one allowed): the tool gets the task's environment
    and the user's HOME, none of OpenCode's names or private dirs, its stdio, its cwd and its exit status."""
    own, tools = split_agent_env({"OPENCODE_ENV_UPSTREAM_KEY": "secret", "OPENCODE_CONFIG": "/c", "TASK": "a 'b' $c"})
    assert set(own) == {"OPENCODE_ENV_UPSTREAM_KEY", "OPENCODE_CONFIG"}
    root = AgentRoot(str(tmp_path))
    broker = start_broker(root, tmp_path, tools, allowed_uid=os.getuid())
    try:
        opencode_env = {"PATH": "/usr/bin:/bin", "XDG_DATA_HOME": "/private", "HOME": "/private", **own}
        ran = subprocess.run(
            [root.shell, "-c", "env; pwd; read line; echo got $line; echo oops >&2; exit 7"],
            env=opencode_env,
            input="stdin-line\n",
            check=False,
            capture_output=True,
            text=True,
            cwd=tmp_path / "run",
        )
        assert ran.returncode == 7, ran.stderr
        lines = ran.stdout.splitlines()
        assert "TASK=a 'b' $c" in lines
        assert f"HOME={tmp_path}" in lines
        assert "got stdin-line" in lines
        assert str(tmp_path / "run") in lines
        assert ran.stderr == "oops\n"
        assert "secret" not in ran.stdout
        assert "OPENCODE_CONFIG" not in ran.stdout
        assert "/private" not in ran.stdout
    finally:
        broker.kill()
        broker.wait()


def test_the_broker_refuses_a_client_of_another_uid(tmp_path: Path) -> None:
    """The socket's permissions aside (root, as this test runs in CI, passes them): the peer's uid is checked."""
    root = AgentRoot(str(tmp_path))
    broker = start_broker(root, tmp_path, {}, allowed_uid=os.getuid() + 4242)
    try:
        ran = subprocess.run([root.shell, "-c", "echo RAN"], capture_output=True, text=True, check=False)
        assert (ran.returncode, ran.stdout) == (126, "")
        assert "refused" in ran.stderr
    finally:
        broker.kill()
        broker.wait()
    assert f"refused a tool request from uid {os.getuid()}" in (tmp_path / "broker.log").read_text()
