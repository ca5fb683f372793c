"""The server: OpenEnv's app (`/health`, `/ws`, `/reset`, `/step`, `/schema`, `POST /mcp`, ...) and a standard
MCP streamable-HTTP endpoint at `/mcp/stream` for generic MCP clients (MCP Inspector, Claude, Cursor, the SDKs).

OpenEnv's own `POST /mcp` is a JSON-RPC shim for OpenEnv clients; it does not speak the MCP `initialize`
handshake, which is why the standard transport is mounted beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from opencode_env.client import TOKEN_VAR
from opencode_env.rollout import run_rollout
from opencode_env.viewer.web import web_router
from server.auth import ALLOW_UNAUTHENTICATED_VAR, BearerAuth, refuse_unprotected_local
from server.disconnect import CancelOnDisconnect
from server.environment import SHUTDOWN_GRACE_S, OpenCodeEnvironment, default_max_sessions, runtime

MCP_STREAM_PATH = "/mcp/stream"


def build_app(token: str | None = None) -> FastAPI:
    """The app; with a token (default: OPENCODE_ENV_TOKEN) every route but /health requires it."""
    shared = runtime()
    app: FastAPI = create_app(
        OpenCodeEnvironment,
        CallToolAction,
        CallToolObservation,
        env_name="opencode_env",
        max_concurrent_envs=default_max_sessions(),
    )
    stream = shared.mcp.http_app(path="/stream", stateless_http=True)
    app.mount("/mcp", stream)
    app.include_router(web_router(lambda request, progress: run_rollout(request, shared.backend, progress=progress)))
    openenv_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application: FastAPI) -> AsyncIterator[None]:
        async with openenv_lifespan(application), stream.lifespan(stream):
            yield
            await shared.cancel_in_flight()

    app.router.lifespan_context = lifespan
    token = os.environ.get(TOKEN_VAR, "") if token is None else token
    app.add_middleware(CancelOnDisconnect)
    if token:
        app.add_middleware(BearerAuth, token=token)
    return app


def main(host: str | None = None, port: int | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    host = host or os.environ.get("HOST", "0.0.0.0")
    refusal = refuse_unprotected_local(
        host,
        runtime().backend_name,
        os.environ.get(TOKEN_VAR, ""),
        os.environ.get(ALLOW_UNAUTHENTICATED_VAR, "") == "1",
    )
    if refusal:
        raise SystemExit(refusal)
    logging.getLogger("opencode_env.server").info(
        "sandbox backend: %s; at most %d concurrent sessions; standard MCP endpoint at %s",
        runtime().backend_name,
        default_max_sessions(),
        MCP_STREAM_PATH,
    )
    uvicorn.run(
        app,
        host=host,
        port=port or int(os.environ.get("PORT", "8000")),
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
    )


app = build_app()


if __name__ == "__main__":
    main()
