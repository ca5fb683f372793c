"""`GET /metadata`: OpenEnv's fields, plus what an operator needs to know: the backend, whether it can run
rollouts (and if not, what to set), the access rule, and the rollout cap."""

from __future__ import annotations

import os
import shutil
from typing import Literal, Protocol, runtime_checkable

from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from server.auth import ALLOW_UNAUTHENTICATED_VAR, AccessPolicy


@runtime_checkable
class Preflighted(Protocol):
    """A backend that has checked, once, whether it can run a rollout here (None: it can)."""

    def preflight_problem(self) -> str | None: ...


class ServerMetadata(EnvironmentMetadata):  # type: ignore[misc]
    backend: str = Field(description="The sandbox backend every rollout runs on (local, e2b, ...).")
    backend_usable: bool | None = Field(
        description="Whether the backend can run rollouts here; None when it has not been checked."
    )
    preflight: str | None = Field(
        None, description="Why the backend cannot run rollouts and what to set; None when nothing is known wrong."
    )
    access: Literal["token", "loopback_only", "open"] = Field(
        description="token: every route but /health needs the bearer token; loopback_only: only this machine "
        f"is served (set OPENCODE_ENV_TOKEN to serve others); open: {ALLOW_UNAUTHENTICATED_VAR}=1."
    )
    max_concurrent_rollouts: int = Field(description="Rollouts that run at once, over every transport.")


def backend_problem(backend: object, name: str) -> str | None:
    """What stops this backend from running rollouts, from its own preflight if it has one, else cheap checks."""
    if isinstance(backend, Preflighted):
        return backend.preflight_problem()
    if name == "e2b" and not os.environ.get("E2B_API_KEY"):
        return "the e2b backend needs an E2B API key: set E2B_API_KEY"
    if name == "local" and os.environ.get("OPENCODE_ENV_LOCAL_ISOLATION") != "none" and not shutil.which("bwrap"):
        return "the local backend needs bubblewrap: install it (apt-get install bubblewrap) or set E2B_API_KEY"
    return None


def access_mode(policy: AccessPolicy) -> Literal["token", "loopback_only", "open"]:
    if policy.token:
        return "token"
    return "open" if policy.allow_unauthenticated else "loopback_only"
