"""The client is light: importing it loads neither openenv-core's server side (Gradio, pandas) nor the pipeline."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = [
    "gradio",
    "pandas",
    "fastapi",
    "fastmcp",
    "openenv",
    "opencode_env.rollout.pipeline",
    "opencode_env.rollout.proxy_session",
]


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
    from opencode_env.rollout.pipeline import run_rollout

    assert opencode_env.run_rollout is run_rollout
    assert opencode_env.__version__


def test_the_capture_proxy_starts_without_a_web_framework_or_the_models() -> None:
    """Every rollout starts a proxy: FastAPI and pydantic tripled its start-up CPU."""
    probe = (
        "import json, sys\n"
        "import opencode_env.proxy.__main__ as entry\n"
        "from opencode_env.proxy.app import create_app\n"
        "from opencode_env.proxy.delivery import delivery_aware_protocol\n"
        "from opencode_env.proxy.settings import ProxySettings\n"
        "create_app(ProxySettings(upstream_url='http://127.0.0.1:9/v1', trace_path='/dev/null'))\n"
        "heavy = ['fastapi', 'starlette', 'pydantic', 'httpx', 'opencode_env.wire']\n"
        "print(json.dumps([name for name in heavy if name in sys.modules]))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(completed.stdout) == []
