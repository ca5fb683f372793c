"""opencode-env: run OpenCode coding-agent rollouts in a sandbox, with exact per-token logprobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opencode_env.models import CommandResult, RolloutRequest, RolloutResult, RolloutTurn
from opencode_env.rollout import run_rollout

if TYPE_CHECKING:
    from opencode_env.client import OpenCodeEnv

__all__ = ["CommandResult", "OpenCodeEnv", "RolloutRequest", "RolloutResult", "RolloutTurn", "run_rollout"]


def __getattr__(name: str) -> Any:
    # The client pulls in openenv-core, whose import takes seconds (it loads gradio): only on first use.
    if name == "OpenCodeEnv":
        from opencode_env.client import OpenCodeEnv

        return OpenCodeEnv
    raise AttributeError(f"module 'opencode_env' has no attribute {name!r}")
