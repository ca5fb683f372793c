"""The server: `create_app(runtime)` composes, by path, the standard MCP transport (`/mcp`, `/mcp/stream`), our
`/metadata` and `/web`, and OpenEnv's app as OpenEnv builds it (`create_app`: `/ws`, `/mcp` over WebSocket,
`/reset`, `/step`, `/state`, `/schema`, `/health`, its docs) for every path none of those takes; one access rule in
front.

`app` is what `uvicorn opencode_env.server.app:app` and `main()` serve: it answers `/health` and `/ready` from its
first moment while the real app is built (`server.staged`) from this process's settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import uvicorn

from opencode_env.server import heap
from opencode_env.server.staged import StagedApp
from opencode_env.settings import Settings, variable
from opencode_env.wire import VERSION

if TYPE_CHECKING:
    from fastapi import FastAPI

    from opencode_env.server.runtime import Runtime

log = logging.getLogger("opencode_env.server")
MCP_PATHS = ("/mcp", "/mcp/", "/mcp/stream", "/mcp/stream/")
# No per-message deflate on /ws: compressing one rollout's result (~550 KB of JSON) cost ~15 ms of the event loop's
# CPU per call, more than the rest of the call's handling (bench.server_load); the bytes saved are a small part of
# a rollout's time on any network.
UVICORN_OPTIONS: dict[str, Any] = {"timeout_graceful_shutdown": 30, "ws_per_message_deflate": False}


def create_app(runtime: Runtime) -> FastAPI:
    """The app serving `runtime`; every route but /health, /ready and the /web page needs its access rule."""
    # Imported here, not at the top: these take seconds, and the staged app answers /health meanwhile.
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import create_app as create_openenv_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from starlette.routing import Route

    from opencode_env.server.disconnect import CancelOnDisconnect, PendingReplies
    from opencode_env.server.environment import ENV_NAME, OpenCodeEnvironment, max_sessions
    from opencode_env.server.gate import AccessGate
    from opencode_env.server.mcp_endpoint import McpEndpoint
    from opencode_env.server.metadata import metadata_router
    from opencode_env.server.result_route import results_router
    from opencode_env.server.served_ports import NoteServedPorts
    from opencode_env.server.shutdown import answer_before_exit
    from opencode_env.viewer.web import web_router

    rollouts = runtime.rollouts
    openenv = create_openenv_app(
        functools.partial(OpenCodeEnvironment, runtime.mcp, runtime.backend.name, runtime.results),
        CallToolAction,
        CallToolObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max_sessions(rollouts.limit),
    )
    standard = runtime.mcp.http_app(path="/mcp", stateless_http=False)
    one_shot = runtime.mcp.http_app(path="/mcp", stateless_http=True)
    streams_closing = asyncio.Event()
    replies = PendingReplies()
    endpoint = McpEndpoint(
        standard=standard, stateless=one_shot, openenv=openenv, closing=streams_closing, replies=replies
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with openenv.router.lifespan_context(openenv), standard.lifespan(standard), one_shot.lifespan(one_shot):
            restore = answer_before_exit(rollouts, replies, streams_closing)
            preflight = await runtime.backend.preflight()
            if preflight.problem:
                level = logging.ERROR if preflight.proven else logging.WARNING
                log.log(level, "the %s backend cannot run rollouts here: %s", runtime.backend.name, preflight.problem)
            try:
                yield
            finally:
                restore()
                streams_closing.set()
                await runtime.cancel_in_flight()

    # OpenEnv's app serves the docs and their OpenAPI document (its routes are the HTTP API an OpenEnv user reads).
    app = FastAPI(
        title="opencode-env", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.include_router(metadata_router(runtime))
    app.include_router(results_router(runtime.results))
    app.router.routes.extend(Route(path, endpoint) for path in MCP_PATHS)
    if rollouts.runs is not None:
        app.include_router(web_router(rollouts.runs, rollouts.run_recorded))
    # OpenEnv's app answers whatever no route here matches (its own routes, its docs, its 404s); as the router's
    # fallback rather than a catch-all mount, so that a route added to this app later still comes first.
    app.router.default = CancelOnDisconnect(openenv, replies)
    app.add_middleware(AccessGate, policy=runtime.access)
    app.add_middleware(NoteServedPorts, ports=runtime.served_ports)
    _log_start(runtime)
    return app


def _log_start(runtime: Runtime) -> None:
    from opencode_env.server.metadata import access_mode

    access = access_mode(runtime.access)
    log.info("opencode-env %s: MCP at /mcp; access: %s", VERSION, access)
    if access == "loopback_only":
        log.warning("no %s set: only connections from this machine are served", variable("token"))


def served(settings: Settings | None = None) -> StagedApp:
    """What a process serves: /health and /ready at once, the app once built from `settings` (default: this
    process's environment)."""

    def build() -> FastAPI:
        from opencode_env.server.runtime import Runtime

        return create_app(Runtime.build(settings))

    return StagedApp(build, built=heap.settle)


def main(host: str | None = None, port: int | None = None, backend: str | None = None) -> None:
    from opencode_env.cli.support import exit_unless_free, settings_or_exit

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = settings_or_exit()
    if backend is not None:
        settings = settings.model_copy(update={"backend": backend})
    host, port = host or settings.host, port or settings.port
    # The runtime takes its address from the settings (the ports a caller may not name, the server each /web row
    # records): the ones `opencode-env serve --host/--port` gave, not the defaults.
    settings = settings.model_copy(update={"host": host, "port": port})
    exit_unless_free(host, port)
    uvicorn.run(served(settings), host=host, port=port, **UVICORN_OPTIONS)


app = served()


if __name__ == "__main__":
    main()
