"""The bare agent: `opencode run` with the rollout's config and env flags, and nothing of the pipeline around it.

It runs under a minimal bubblewrap that only mounts a fresh directory at /home/user, because the demo script
writes to absolute /home/user paths and must not touch the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from opencode_env.rollout import opencode
from opencode_env.sandbox.local.tools import install_cached
from opencode_env.scripted.demo import DEMO_INSTRUCTION
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script


def bare_opencode_run(base_url: str, model_id: str = "scripted-policy") -> float:
    """Seconds for one bare `opencode run` of the demo instruction against base_url."""
    binary = str(install_cached())
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        (home / "workdir").mkdir()
        (home / "instruction.md").write_text(DEMO_INSTRUCTION)
        config = opencode.render_config(base_url=base_url, model_id=model_id, max_tokens_cap=4096, model_options={})
        (home / "opencode.json").write_text(json.dumps(config))
        env = {
            "PATH": f"{Path(binary).parent}:/usr/bin:/bin",
            "HOME": "/home/user",
            **opencode.AGENT_ENV,
            "OPENCODE_CONFIG": "/home/user/opencode.json",
            opencode.MODEL_KEY_ENV_NAME: "sk-bench",
        }
        command = [
            "bwrap",
            "--dev-bind",
            "/",
            "/",
            "--tmpfs",
            "/home",
            "--bind",
            str(home),
            "/home/user",
            "--chdir",
            "/home/user/workdir",
            "--",
            binary,
            "run",
            "--format",
            "json",
            "--title",
            "bench",
        ]
        started = time.perf_counter()
        with (home / "instruction.md").open("rb") as stdin:
            completed = subprocess.run(command, stdin=stdin, capture_output=True, env=env, timeout=300, check=False)
        elapsed = time.perf_counter() - started
        if completed.returncode != 0:
            raise RuntimeError(f"bare opencode run failed: {completed.stderr[-2000:]!r}")
        return elapsed


def capture_opencode_request() -> dict[str, Any]:
    """OpenCode's first request body of the demo task, as it sends it."""
    with ScriptedModelServer(demo_script()) as model:
        bare_opencode_run(model.base_url)
        return dict(model.exchanges[0].request)


if __name__ == "__main__":
    body = capture_opencode_request()
    print(len(json.dumps(body)), sorted(body), os.getpid())
