"""What stops the server's backend from running rollouts, and what to set: from the backend's own preflight when it
has one (a verdict it reached once, at start), else from cheap checks of its configuration."""

from __future__ import annotations

import os
import shutil
from typing import Protocol, runtime_checkable


@runtime_checkable
class Preflighted(Protocol):
    """A backend that has checked, once, whether it can run a rollout here (None: it can)."""

    def preflight_problem(self) -> str | None: ...


@runtime_checkable
class RunsPreflight(Protocol):
    """A backend that can check itself once at start (the local one runs its exact isolation once)."""

    async def preflight(self) -> str | None: ...


def backend_problem(backend: object, name: str) -> str | None:
    """What stops this backend from running rollouts, from its own preflight if it has one, else cheap checks."""
    if isinstance(backend, Preflighted):
        return backend.preflight_problem()
    if name == "e2b" and not os.environ.get("E2B_API_KEY"):
        return "the e2b backend needs an E2B API key: set E2B_API_KEY"
    if name == "local" and os.environ.get("OPENCODE_ENV_LOCAL_ISOLATION") != "none" and not shutil.which("bwrap"):
        return "the local backend needs bubblewrap: install it (apt-get install bubblewrap) or set E2B_API_KEY"
    return None
