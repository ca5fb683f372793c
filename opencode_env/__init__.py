"""opencode-env: run OpenCode coding-agent rollouts in a sandbox, with exact per-token logprobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opencode_env.client.client import OpenCodeEnv
    from opencode_env.rollout.in_process import InProcess
    from opencode_env.rollout.pipeline import run_rollout
    from opencode_env.wire import VERSION as __version__
    from opencode_env.wire import CommandResult, RolloutRequest, RolloutResult, RolloutTurn

__all__ = [
    "CommandResult",
    "InProcess",
    "OpenCodeEnv",
    "RolloutRequest",
    "RolloutResult",
    "RolloutTurn",
    "__version__",
    "run_rollout",
]


MODELS = ("CommandResult", "RolloutRequest", "RolloutResult", "RolloutTurn")


def __getattr__(name: str) -> Any:
    # Each on first use: a client never loads the pipeline, the pipeline never loads the client, and the capture
    # proxy (a process per rollout, importing opencode_env.proxy) loads neither the models nor pydantic: the version
    # lives in the wire package too, so it is one attribute away as well.
    if name == "__version__":
        from opencode_env.wire import VERSION

        return VERSION
    if name in MODELS:
        from opencode_env import wire

        return getattr(wire, name)
    if name == "OpenCodeEnv":
        from opencode_env.client.client import OpenCodeEnv

        return OpenCodeEnv
    if name == "InProcess":
        from opencode_env.rollout.in_process import InProcess

        return InProcess
    if name == "run_rollout":
        from opencode_env.rollout.pipeline import run_rollout

        return run_rollout
    raise AttributeError(f"module 'opencode_env' has no attribute {name!r}")
