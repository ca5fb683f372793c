"""opencode-env: run OpenCode coding-agent rollouts in a sandbox, with exact per-token logprobs."""

from opencode_env.models import CommandResult, RolloutRequest, RolloutResult, RolloutTurn
from opencode_env.rollout import run_rollout

__all__ = ["CommandResult", "RolloutRequest", "RolloutResult", "RolloutTurn", "run_rollout"]
