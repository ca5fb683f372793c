"""The server: OpenEnv's app (`/health`, `/ws`, `/reset`, `/step`, `/schema`, `/metadata`, ...) with `/mcp` serving
both the standard MCP streamable-HTTP transport (MCP Inspector, Claude, Cursor, the SDKs) and OpenEnv's JSON-RPC
clients (see `server.mcp_route`); `/mcp/stream` is an alias of the standard transport.

What is served (`app`) answers `/health` from its first moment while this app is built (`server.staged`); who may
use the rest is decided per request (`server.auth`, `server.gate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from opencode_env.rollout.upstream_policy import UpstreamPolicy
from opencode_env.viewer.web import runs_from_environment, web_router
from opencode_env.wire.access import TOKEN_VAR
from opencode_env.wire.version import VERSION
from server import heap
from server.auth import ALLOW_UNAUTHENTICATED_VAR, AccessPolicy
from server.preflight import RunsPreflight
from server.rollouts import own_ports
from server.staged import StagedApp

if TYPE_CHECKING:
    from fastapi import FastAPI

    from server.disconnect import PendingReplies
    from server.environment import Runtime

log = logging.getLogger("opencode_env.server")
MCP_PATH = "/mcp"
SHUTDOWN_GRACE_S = 30.0
REPLY_GRACE_S = 10.0
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# No per-message deflate on /ws: compressing one rollout's result (~550 KB of JSON) cost ~15 ms of the event loop's
# CPU per call, more than the rest of the call's handling (bench.server_load); the bytes saved are a small part of
# a rollout's time on any network.
UVICORN_OPTIONS: dict[str, Any] = {"timeout_graceful_shutdown": int(SHUTDOWN_GRACE_S), "ws_per_message_deflate": False}


def access_policy(backend: str, token: str | None = None) -> AccessPolicy:
    return AccessPolicy(
        token=os.environ.get(TOKEN_VAR, "") if token is None else token,
        allow_unauthenticated=os.environ.get(ALLOW_UNAUTHENTICATED_VAR, "") == "1",
        backend=backend,
    )


def build_app(token: str | None = None) -> FastAPI:
    """The app; with a token (default: OPENCODE_ENV_TOKEN) every route but /health requires it."""
    # Imported here, not at the top: these take seconds, and the staged app answers /health meanwhile.
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    from server.disconnect import CancelOnDisconnect, PendingReplies
    from server.environment import OpenCodeEnvironment, max_sessions, runtime
    from server.gate import AccessGate
    from server.mcp_route import McpRouter

    shared = runtime()
    policy = access_policy(shared.backend_name, token)
    callers_are_local = not policy.token and not policy.allow_unauthenticated
    shared.rollouts.upstream_policy = UpstreamPolicy.from_environment(
        os.environ, own_ports(), callers_are_local=callers_are_local
    )
    _log_start(shared, policy)
    app: FastAPI = create_app(
        OpenCodeEnvironment,
        CallToolAction,
        CallToolObservation,
        env_name="opencode_env",
        max_concurrent_envs=max_sessions(shared.rollouts.limit),
    )
    _replace_metadata_route(app, shared, policy)
    streams_closing = asyncio.Event()
    replies = PendingReplies()
    standard = shared.mcp.http_app(path=MCP_PATH, stateless_http=False)
    one_shot = shared.mcp.http_app(path=MCP_PATH, stateless_http=True)
    shared.rollouts.runs = runs_from_environment()
    app.include_router(web_router(shared.rollouts.runs, shared.rollouts.run_recorded))
    openenv_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application: FastAPI) -> AsyncIterator[None]:
        async with openenv_lifespan(application), standard.lifespan(standard), one_shot.lifespan(one_shot):
            restore = _answer_before_exit(shared, replies, streams_closing)
            if isinstance(shared.backend, RunsPreflight):
                problem = await shared.backend.preflight()
                if problem:
                    log.error("the %s backend cannot run rollouts here: %s", shared.backend_name, problem)
            try:
                yield
            finally:
                restore()
                streams_closing.set()
                await shared.cancel_in_flight()

    app.router.lifespan_context = lifespan
    app.add_middleware(McpRouter, standard=standard, stateless=one_shot, closing=streams_closing, replies=replies)
    app.add_middleware(CancelOnDisconnect, replies=replies)
    app.add_middleware(AccessGate, policy=policy)
    return app


def _replace_metadata_route(app: FastAPI, shared: Runtime, policy: AccessPolicy) -> None:
    from server.environment import TOOL_DESCRIPTION
    from server.metadata import ServerMetadata, access_mode, backend_problem
    from server.preflight import Preflighted

    app.router.routes[:] = [route for route in app.router.routes if getattr(route, "path", None) != "/metadata"]

    @app.get("/metadata", response_model=ServerMetadata, tags=["Environment Info"])
    def metadata() -> ServerMetadata:
        problem = backend_problem(shared.backend, shared.backend_name)
        return ServerMetadata(
            name="opencode_env",
            description=TOOL_DESCRIPTION,
            version=VERSION,
            backend=shared.backend_name,
            backend_usable=False if problem else (True if isinstance(shared.backend, Preflighted) else None),
            preflight=problem,
            access=access_mode(policy),
            max_concurrent_rollouts=shared.rollouts.limit,
        )


def _answer_before_exit(shared: Runtime, replies: PendingReplies, streams_closing: asyncio.Event) -> Callable[[], None]:
    """On SIGTERM/SIGINT, cancel the rollouts and let each caller get its partial result before uvicorn starts
    closing connections (it closes WebSockets at once), then end the MCP sessions' event streams (uvicorn would
    wait for them). Returns the function that puts the handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in SHUTDOWN_SIGNALS}

    draining: list[asyncio.Task[None]] = []

    def pass_on(sig: int, frame: FrameType | None) -> None:
        handler = previous[signal.Signals(sig)]
        if callable(handler):
            handler(sig, frame)

    async def drain_then_exit(sig: int, frame: FrameType | None) -> None:
        await shared.rollouts.shut_down(SHUTDOWN_GRACE_S)
        # The answers just produced must be sent before uvicorn closes the WebSockets (HTTP answers it waits for).
        await replies.settled(REPLY_GRACE_S)
        streams_closing.set()
        pass_on(sig, frame)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        if shared.rollouts.shutting_down:
            pass_on(sig, frame)  # a second signal: stop now
            return
        log.info(
            "signal %d: cancelling %d rollout(s), answering their callers, then exiting", sig, shared.rollouts.in_flight
        )
        loop.call_soon_threadsafe(lambda: draining.append(asyncio.ensure_future(drain_then_exit(sig, frame))))

    for sig in SHUTDOWN_SIGNALS:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _log_start(shared: Runtime, policy: AccessPolicy) -> None:
    from server.metadata import access_mode

    log.info(
        "opencode-env %s: %s backend; at most %d rollouts at once; MCP at %s; access: %s",
        VERSION,
        shared.backend_name,
        shared.rollouts.limit,
        MCP_PATH,
        access_mode(policy),
    )
    if access_mode(policy) == "loopback_only":
        log.warning("no %s set: only connections from this machine are served", TOKEN_VAR)


def main(host: str | None = None, port: int | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    uvicorn.run(
        app,
        host=host or os.environ.get("HOST", "0.0.0.0"),
        port=port or int(os.environ.get("PORT", "8000")),
        **UVICORN_OPTIONS,
    )


# What `uvicorn server.app:app` and `main()` serve: /health at once, everything else once built.
app = StagedApp(build_app, built=heap.settle)


if __name__ == "__main__":
    main()
