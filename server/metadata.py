"""`GET /metadata`: OpenEnv's fields (what the environment's `get_metadata` answers), plus what an operator needs to
know: the backend, whether it can run rollouts (and if not, what to set), the access rule, and the rollout cap.
Served ahead of OpenEnv's own `/metadata`, whose answer is the first part of this one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from opencode_env.server.auth import AccessPolicy
from opencode_env.server.environment import metadata
from opencode_env.settings import variable

if TYPE_CHECKING:
    from opencode_env.server.runtime import Runtime


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
        f"is served (set {variable('token')} to serve others); open: {variable('allow_unauthenticated')}=1."
    )
    max_concurrent_rollouts: int = Field(description="Rollouts that run at once, over every transport.")


def access_mode(policy: AccessPolicy) -> Literal["token", "loopback_only", "open"]:
    if policy.token:
        return "token"
    return "open" if policy.allow_unauthenticated else "loopback_only"


def metadata_router(runtime: Runtime) -> APIRouter:
    router = APIRouter()
    backend = runtime.backend

    @router.get("/metadata", response_model=ServerMetadata, tags=["Environment Info"])
    def server_metadata() -> ServerMetadata:
        verdict = backend.preflight_verdict()
        return ServerMetadata(
            **metadata(backend.name).model_dump(),
            backend=backend.name,
            backend_usable=False if verdict.problem else (True if verdict.proven else None),
            preflight=verdict.problem,
            access=access_mode(runtime.access),
            max_concurrent_rollouts=runtime.rollouts.limit,
        )

    return router
