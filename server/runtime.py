"""What one server shares across its transports, built once from its settings and handed to the app factory: the
sandbox backend, the rollouts under one cap, the MCP server with its one tool, and who may call it. Nothing here is
global: two servers in one process (as the tests run them) each have their own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastmcp import FastMCP

from opencode_env.rollout.upstream_policy import UpstreamPolicy
from opencode_env.sandbox import make_backend
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.server.auth import AccessPolicy, BrowserRule, revoked_names
from opencode_env.server.result_store import ResultsDir, ResultStore
from opencode_env.server.rollouts import CANCEL_GRACE_S, Rollouts
from opencode_env.server.runs import Runs, ServerOrigin
from opencode_env.server.served_ports import ServedPorts
from opencode_env.server.tool import build_mcp
from opencode_env.settings import Settings
from opencode_env.wire import VERSION

log = logging.getLogger("opencode_env.server")
STDIO = "stdio"
"""The address of a server over stdio (`opencode-env mcp`): it has no HTTP route."""


@dataclass
class Runtime:
    settings: Settings
    backend: SandboxBackend
    rollouts: Rollouts
    mcp: FastMCP
    access: AccessPolicy
    served_ports: ServedPorts
    """The ports the server is reached on, which a caller's base_url may never name (noted by the app per request)."""
    results: ResultStore
    """Every finished result by reference, for the operator's retention (the tool's answer links to it)."""

    @classmethod
    def build(
        cls,
        settings: Settings | None = None,
        *,
        backend: SandboxBackend | None = None,
        max_rollouts: int | None = None,
        keep_results: bool = True,
        address: str | None = None,
    ) -> Runtime:
        """The runtime of a server configured by `settings` (default: this process's environment). `backend` and
        `max_rollouts` replace what the settings say; without `keep_results` finished results stay in memory only.
        `address`: where the server is reached, as each rollout's row records it (default: HOST:PORT; STDIO over
        stdio, where the answers name no URL)."""
        settings = settings or Settings.load()
        backend = backend or make_backend(settings.backend, settings)
        access = AccessPolicy(
            token=settings.token.get_secret_value(),
            allow_unauthenticated=settings.allow_unauthenticated,
            risk=backend.capabilities.risk,
            browsers=BrowserRule.of_this_machine(f"{settings.allowed_hosts},{settings.space_host}"),
            revoked=revoked_names(settings.revoked_callers),
        )
        callers_are_local = not access.token and not access.allow_unauthenticated
        served_ports = ServedPorts(settings.port)
        upstream_policy = UpstreamPolicy.configured(
            settings.upstream_allow, served_ports, callers_are_local=callers_are_local
        )
        results = ResultsDir.configured(settings.results_dir, settings.results_keep) if keep_results else None
        origin = ServerOrigin.this_process(address=address or f"{settings.host}:{settings.port}")
        rollouts = Rollouts(
            backend,
            max_rollouts or settings.max_concurrent_envs or backend.capabilities.default_concurrency,
            upstream_policy=upstream_policy,
            runs=Runs(keep=settings.web_results, results=results, origin=origin),
            settings=settings,
            per_caller=settings.rollouts_per_caller,
            queued_per_caller=settings.queued_per_caller,
        )
        log.info(
            "opencode-env %s serving rollouts on the %s backend, at most %d at once",
            VERSION,
            backend.name,
            rollouts.limit,
        )
        store = ResultStore.configured(settings.results_dir, settings.result_retention_s)
        mcp = build_mcp(rollouts, store, http=address != STDIO)
        return cls(settings, backend, rollouts, mcp, access, served_ports, store)

    async def cancel_in_flight(self, timeout_s: float = CANCEL_GRACE_S) -> None:
        """Cancel every rollout still running (server shutdown) and wait for their sandboxes to close."""
        await self.rollouts.shut_down(timeout_s)
        closed = await self.backend.close_all()
        if closed:
            log.info("shutting down: closed %d sandbox(es) whose rollouts had been torn down", closed)
