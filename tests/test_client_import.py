"""The client is light: importing it loads neither openenv-core's server side (Gradio, pandas) nor the pipeline."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["gradio", "pandas", "fastapi", "fastmcp", "openenv", "opencode_env.rollout", "opencode_env.proxy_session"]


def test_importing_the_client_loads_nothing_heavy() -> None:
    probe = (
        "import json, sys\n"
        "from opencode_env import OpenCodeEnv, RolloutRequest\n"
        "OpenCodeEnv\n"
        f"print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(completed.stdout) == []


def test_the_pipeline_is_still_one_attribute_away() -> None:
    import opencode_env
    from opencode_env.rollout import run_rollout

    assert opencode_env.run_rollout is run_rollout
    assert opencode_env.__version__
