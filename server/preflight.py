"""What stops the server's backend from running rollouts, and what to set: the sandbox registry's answer (the
backend's own preflight verdict when it has one, else a cheap check of what it needs from the environment)."""

from __future__ import annotations

from opencode_env.sandbox import Preflighted, RunsPreflight, backend_problem

__all__ = ["Preflighted", "RunsPreflight", "backend_problem"]
