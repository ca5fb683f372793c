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
import socket
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import uvicorn

from opencode_env.server import heap
from opencode_env.server.staged import StagedApp
from opencode_env.settings import Settings, settings_or_exit, variable
from opencode_env.wire import VERSION

if TYPE_CHECKING:
    from fastapi import FastAPI

    from opencode_env.server.rollouts import Rollouts
    from opencode_env.server.runtime import Runtime
    from opencode_env.server.session_quota import SessionQuota
    from opencode_env.viewer.rows import Caller, RunView
    from opencode_env.wire import RolloutRequest

log = logging.getLogger("opencode_env.server")
MCP_PATHS = ("/mcp", "/mcp/", "/mcp/stream", "/mcp/stream/")
# No per-message deflate on /ws: compressing one rollout's result (~550 KB of JSON) cost ~15 ms of the event loop's
# CPU per call, more than the rest of the call's handling (bench.server_load); the bytes saved are a small part of
# a rollout's time on any network. The standard library's event loop, not uvloop (uvicorn's choice where installed):
# the server starts its rollouts' subprocesses, and uvloop forks the whole server for each (bench.event_loop_spawn).
UVICORN_OPTIONS: dict[str, Any] = {"timeout_graceful_shutdown": 30, "ws_per_message_deflate": False, "loop": "asyncio"}


def create_app(runtime: Runtime) -> FastAPI:
    """The app serving `runtime`; every route but /health, /ready and the /web page needs its access rule."""
    # Imported here, not at the top: these take seconds, and the staged app answers /health meanwhile.
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import create_app as create_openenv_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from starlette.routing import Route

    from opencode_env.server.callers import callers_router
    from opencode_env.server.disconnect import CancelOnDisconnect, PendingReplies
    from opencode_env.server.environment import ENV_NAME, OpenCodeEnvironment, max_sessions
    from opencode_env.server.gate import caller_of
    from opencode_env.server.mcp_endpoint import McpEndpoint
    from opencode_env.server.metadata import metadata_router
    from opencode_env.server.result_route import results_router
    from opencode_env.server.session_quota import SessionQuota
    from opencode_env.server.shutdown import answer_before_exit
    from opencode_env.viewer.web import web_router

    rollouts = runtime.rollouts
    openenv = create_openenv_app(
        functools.partial(OpenCodeEnvironment, runtime.mcp, runtime.backend.name),
        CallToolAction,
        CallToolObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max(max_sessions(rollouts.limit), runtime.settings.mcp_sessions),
    )
    standard = runtime.mcp.http_app(
        path="/mcp", stateless_http=False, session_idle_timeout=runtime.settings.mcp_session_idle_s
    )
    one_shot = runtime.mcp.http_app(path="/mcp", stateless_http=True)
    streams_closing = asyncio.Event()
    replies = PendingReplies()
    quota = SessionQuota(runtime.settings.mcp_sessions_per_caller, functools.partial(_session_owners, standard))
    endpoint = McpEndpoint(
        standard=standard, stateless=one_shot, openenv=openenv, closing=streams_closing, replies=replies, quota=quota
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with openenv.router.lifespan_context(openenv), standard.lifespan(standard), one_shot.lifespan(one_shot):
            # FastMCP builds the session manager here and passes no session cap through: the SDK's default is 10,000.
            _session_manager(standard).max_sessions = runtime.settings.mcp_sessions
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
    app.include_router(callers_router(runtime.access))
    app.router.routes.extend(Route(path, endpoint) for path in MCP_PATHS)
    if rollouts.runs is not None:
        app.include_router(web_router(rollouts.runs, functools.partial(_start_run, rollouts), caller_of))
    # OpenEnv's app answers whatever no route here matches (its own routes, its docs, its 404s); as the router's
    # fallback rather than a catch-all mount, so that a route added to this app later still comes first.
    app.router.default = CancelOnDisconnect(openenv, replies)
    _guard(app, openenv, runtime, quota)
    _log_start(runtime)
    return app


def _guard(app: FastAPI, openenv: FastAPI, runtime: Runtime, quota: SessionQuota) -> None:
    """In front of every route: the access rule, then (knowing the caller) each caller's request bodies and
    WebSocket sessions bounded; and no 422 repeats what the caller sent."""
    from opencode_env.server.bodies import MIB, BodyLimit, unechoed_validation_errors
    from opencode_env.server.gate import AccessGate
    from opencode_env.server.served_ports import NoteServedPorts
    from opencode_env.server.session_quota import WebSocketSessions

    for served_app in (app, openenv):
        unechoed_validation_errors(served_app)
    settings = runtime.settings
    app.add_middleware(WebSocketSessions, quota=quota)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_mb * MIB, per_caller_bytes=settings.body_mb_per_caller * MIB
    )
    app.add_middleware(AccessGate, policy=runtime.access)
    app.add_middleware(NoteServedPorts, ports=runtime.served_ports)


def _session_manager(app: Any) -> Any:
    """The MCP SDK's session manager behind FastMCP's streamable HTTP app (the endpoint of its one route)."""
    for route in app.router.routes:
        manager = getattr(getattr(route, "endpoint", None), "session_manager", None)
        if manager is not None:
            return manager
    raise RuntimeError("FastMCP's streamable HTTP app has no session manager where this server looks for it")


def _session_owners(app: Any) -> list[str]:
    """The caller id of each open session's owner, as the SDK's session manager keeps them (the principal
    mcp_endpoint hands it); none before the manager exists."""
    try:
        owners = _session_manager(app)._session_owners
    except RuntimeError:
        return []
    return [owner["client_id"] for owner in owners.values()]


def _start_run(rollouts: Rollouts, request: RolloutRequest, caller: Caller) -> RunView:
    """The /web form's rollout, owned by the caller who sent it, through the server's cap (refused with RunsFull when
    the caller has its share of calls waiting)."""
    from opencode_env.server.fair_slots import OverShare
    from opencode_env.server.runs import RunsFull

    assert rollouts.runs is not None
    try:
        rollouts.check_room(caller.id)
    except OverShare as over:
        raise RunsFull(str(over)) from over
    return rollouts.runs.start(request, rollouts.run_recorded, caller)


def _log_start(runtime: Runtime) -> None:
    from opencode_env.server.metadata import access_mode

    access = access_mode(runtime.access)
    log.info("opencode-env %s: MCP at /mcp; access: %s", VERSION, access)
    if access == "loopback_only":
        log.warning("no %s set: only connections from this machine are served", variable("token"))
    if access != "token":
        names = ", ".join(sorted(runtime.access.browsers.host_names))
        log.warning(
            "no %s set: browsers are served only from this server's own pages (no cross-site request, a POST only as "
            "application/json) and only under its IP addresses or these names: %s (add more in %s)",
            variable("token"),
            names,
            variable("allowed_hosts"),
        )
    else:
        log.info("callers are told apart by their tokens: the operator's sees every run, a caller's only its own")


def served(settings: Settings | None = None) -> StagedApp:
    """What a process serves: /health and /ready at once, the app once built from `settings` (default: this
    process's environment)."""

    def build() -> FastAPI:
        from opencode_env.server.runtime import Runtime

        return create_app(Runtime.build(settings))

    return StagedApp(build, built=heap.settle)


def main(host: str | None = None, port: int | None = None, backend: str | None = None) -> None:
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


def exit_unless_free(host: str, port: int) -> None:
    """Before anything starts (and logs that it is ready): a port another process holds ends the command with what
    to do. A probe, then uvicorn binds for itself; a process that takes the port in between still fails there."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as error:
        print(
            f"opencode-env serve: cannot listen on {host}:{port}: {error.strerror or error} (another server on this "
            "port? stop it, or pass --port N / set PORT)",
            file=sys.stderr,
        )
        raise SystemExit(2) from error


app = served()


if __name__ == "__main__":
    main()
