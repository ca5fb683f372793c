"""`POST /callers`: the operator issues a caller its token (`server.auth.caller_token`). A caller token passes the
server's access rule like the operator's, and whoever holds it sees only the runs it started on /web; the operator's
token sees every run. The same name always gets the same token (it is derived, not stored): a caller who lost its
token asks again. A name in OPENCODE_ENV_REVOKED_CALLERS is refused and never issued again; changing
OPENCODE_ENV_TOKEN withdraws every caller token at once. `opencode-env caller-token NAME` derives the same token
offline, from the operator's token in the environment."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from opencode_env.server.auth import AccessPolicy, caller_token, withdrawn
from opencode_env.server.gate import caller_of
from opencode_env.settings import variable

CALLERS_PATH = "/callers"


class CallerRequest(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The caller's name: 1-64 letters, digits, _ or -.")


class CallerToken(BaseModel):
    name: str
    token: str = Field(description="Send it as `Authorization: Bearer <token>` (OpenCodeEnv(token=...)).")


def callers_router(policy: AccessPolicy) -> APIRouter:
    router = APIRouter()

    @router.post(CALLERS_PATH, include_in_schema=False)
    async def issue(body: CallerRequest, request: Request) -> CallerToken:
        if not policy.token:
            raise HTTPException(
                409, f"this server has no {variable('token')}: callers cannot be told apart; set it to issue tokens"
            )
        if not caller_of(request).operator:
            raise HTTPException(403, f"only the operator's {variable('token')} issues caller tokens")
        if body.name in policy.revoked:
            raise HTTPException(409, withdrawn(body.name))
        return CallerToken(name=body.name, token=caller_token(policy.token, body.name))

    return router
