"""The client: `OpenCodeEnv(base_url=...)`, a session on the server's OpenEnv WebSocket for the `run_rollout` tool,
async, with `.sync()` or in a notebook's running loop. It speaks OpenEnv's `/ws` itself and imports nothing of the
pipeline, so importing it is fast; it is a runner (wire/runner.py) like `InProcess` and `RayRollouts`, and each
call waits by its own budget so it never gives up before the server does."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from opencode_env.client.by_reference import ResultFetchError, answer_of, fetch_result
from opencode_env.client.container import LocalContainer
from opencode_env.client.sync_view import SyncView
from opencode_env.client.ws_session import OpenEnvSession, ServerError, Tool
from opencode_env.settings import variable
from opencode_env.wire import TOOL_NAME, RolloutRequest, RolloutResult, RunnerCapabilities, total_budget_s
from opencode_env.wire.fan_out import RunOne, concurrency_of, fan_out

CLIENT_MARGIN_S = 120.0
DEFAULT_CONCURRENCY = 4
DEFAULT_MESSAGE_TIMEOUT_S = 3600.0
__all__ = ["OpenCodeEnv", "ResultFetchError", "RolloutAnswerError", "ServerError", "Tool"]


class RolloutAnswerError(RuntimeError):
    """The server's answer to `run_rollout` was not a RolloutResult."""


ROUTES = ("/mcp/stream", "/mcp", "/ws", "/web", "/health", "/ready", "/metadata")
"""The server's own routes: a URL naming one of them means the server whose route it is."""


def server_root(base_url: str) -> str:
    """The server's URL from what a caller may give: its root, or the URL of one of its routes (an MCP client's
    `/mcp`, the viewer's `/web`); the client adds the route it speaks itself."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(
            f"base_url: the server's URL, e.g. http://localhost:8000 or https://NAME.hf.space; got {base_url!r}"
        )
    path = parts.path.rstrip("/")
    for route in ROUTES:
        if path.endswith(route):
            path = path.removesuffix(route)
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


SPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def space_url(repo_id: str) -> str:
    """A Hugging Face Space's URL from its name, as the Hub serves it: "owner/space" -> https://owner-space.hf.space."""
    if not SPACE_ID.fullmatch(repo_id.strip()):
        raise ValueError(f"repo_id: a Space's name as owner/space (e.g. openenv/opencode-env); got {repo_id!r}")
    owner, name = repo_id.strip().lower().split("/")
    return f"https://{re.sub(r'[_.]', '-', owner)}-{re.sub(r'[_.]', '-', name)}.hf.space"


def space_image(repo_id: str, tag: str = "latest") -> str:
    """A Space's image in Hugging Face's registry (what OpenEnv's `from_env` runs)."""
    host = space_url(repo_id).removeprefix("https://").removesuffix(".hf.space")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise ValueError(f"tag: an image tag such as latest; got {tag!r}")
    return f"registry.hf.space/{host}:{tag}"


def client_timeout_s(request: RolloutRequest) -> float:
    return total_budget_s(request) + CLIENT_MARGIN_S


def parse_result(data: Any) -> RolloutResult:
    """The tool's answer as a RolloutResult; anything else is an error, never a guess."""
    if not isinstance(data, dict):
        raise RolloutAnswerError(f"run_rollout answered with {type(data).__name__}, not a RolloutResult object")
    return RolloutResult.model_validate(data)


def as_request(request: RolloutRequest | None, fields: Mapping[str, Any]) -> RolloutRequest:
    """A RolloutRequest, or one validated from its fields given as keyword arguments (never both)."""
    if request is None:
        return RolloutRequest.model_validate(fields)
    if fields:
        raise TypeError("pass either a RolloutRequest or keyword fields, not both")
    return request


class ToolSession(Protocol):
    """What a rollout's call needs of a session: OpenEnv's MCPToolClient and OpenCodeEnv both are one."""

    base_url: str
    _message_timeout: float
    _token: str
    _connect_timeout: float

    async def call_tool(self, name: str, **arguments: Any) -> Any: ...


async def call_rollout(session: ToolSession, request: RolloutRequest) -> RolloutResult:
    """One rollout over `session`, waiting the rollout's own budget; a result answered by reference is fetched."""
    previous = session._message_timeout
    session._message_timeout = max(previous, client_timeout_s(request))
    try:
        data = await session.call_tool(TOOL_NAME, **request.model_dump(mode="json"))
    finally:
        session._message_timeout = previous
    answer = answer_of(data)
    if answer is None:
        return parse_result(data)
    return await fetch_result(
        session.base_url, answer, token=session._token, connect_timeout_s=session._connect_timeout
    )


class OpenCodeEnv(OpenEnvSession):
    """A session on an opencode-env server (OpenEnv's `/ws` protocol), with `run_rollout` and `run_rollouts`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S,
        max_message_size_mb: float = 100.0,
        ready_timeout_s: float = 300.0,
    ) -> None:
        """`ready_timeout_s`: how long to wait for a server that is still loading (its /ready says so)."""
        resolved = token if token is not None else os.environ.get(variable("token"), "")
        super().__init__(
            server_root(base_url),
            token=resolved,
            connect_timeout_s=connect_timeout_s,
            message_timeout_s=message_timeout_s,
            max_message_size_mb=max_message_size_mb,
            ready_timeout_s=ready_timeout_s,
        )
        self._client_options: dict[str, Any] = {
            "token": resolved,
            "connect_timeout_s": connect_timeout_s,
            "message_timeout_s": message_timeout_s,
            "max_message_size_mb": max_message_size_mb,
            "ready_timeout_s": ready_timeout_s,
        }
        self._sync_view: SyncView | None = None
        self._container: LocalContainer | None = None

    @classmethod
    def from_hub(cls, repo_id: str, **options: Any) -> OpenCodeEnv:
        """A client of the Hugging Face Space named `repo_id` ("owner/space"), at its https://owner-space.hf.space.
        A private Space wants its token (`token=`, or OPENCODE_ENV_TOKEN)."""
        return cls(space_url(repo_id), **options)

    @classmethod
    async def from_docker_image(
        cls,
        image: str,
        *,
        engine: str | None = None,
        port: int | None = None,
        env_vars: Mapping[str, str] | None = None,
        ready_timeout_s: float = 300.0,
        **options: Any,
    ) -> OpenCodeEnv:
        """Run `image` (this repository's server image) on this machine with podman or docker (`engine`: the
        executable; None: the first on PATH), wait for its /health, and return a client of it. Closing the client
        stops the container. `env_vars` (e.g. OPENCODE_ENV_TOKEN) reach the container by name, never in argv."""
        container = LocalContainer(engine)
        base_url = await asyncio.to_thread(container.start_container, image, port, env_vars)
        try:
            await asyncio.to_thread(container.wait_for_ready, base_url, ready_timeout_s)
            client = cls(base_url, ready_timeout_s=ready_timeout_s, **options)
        except BaseException:
            await asyncio.to_thread(container.stop_container)
            raise
        client._container = container
        return client

    @classmethod
    async def from_env(cls, repo_id: str, *, tag: str = "latest", **options: Any) -> OpenCodeEnv:
        """OpenEnv's `from_env`: run the Space `repo_id`'s image (registry.hf.space/OWNER-SPACE:TAG) here, as
        `from_docker_image` does with its options. `from_hub` reaches the running Space instead."""
        return await cls.from_docker_image(space_image(repo_id, tag), **options)

    async def close(self) -> None:
        """Close the session, and stop the container `from_docker_image` started."""
        try:
            await super().close()
        finally:
            if self._container is not None:
                container, self._container = self._container, None
                await asyncio.to_thread(container.stop_container)

    disconnect = close

    async def __aenter__(self) -> OpenCodeEnv:
        await self.connect()
        return self

    @property
    def capabilities(self) -> RunnerCapabilities:
        return RunnerCapabilities(
            max_concurrency=DEFAULT_CONCURRENCY, sandboxes="server", where=f"server {self.base_url}"
        )

    async def run_rollout(
        self, request: RolloutRequest | None = None, *, partial: RolloutResult | None = None, **fields: Any
    ) -> RolloutResult:
        """Run one rollout on the server. Pass a RolloutRequest or its fields as keyword arguments. `partial` is
        the runner seam's (the server keeps what a cancelled call captured: it is left as given)."""
        request = as_request(request, fields)
        if self._ws is None:
            async with OpenCodeEnv(self.base_url, **self._client_options) as session:
                return await session.run_rollout(request)
        return await call_rollout(self, request)

    async def run_rollouts(
        self, requests: Sequence[RolloutRequest], *, max_concurrency: int | None = None, progress: bool = True
    ) -> list[RolloutResult]:
        """Run many rollouts (a GRPO group) over up to `max_concurrency` sessions (None: 4); results come back in
        order.

        A rollout that fails, or whose session fails, gets its own result with the error; the others go on.
        """
        concurrency = concurrency_of(max_concurrency, DEFAULT_CONCURRENCY)

        @asynccontextmanager
        async def session_lane() -> AsyncIterator[RunOne]:
            async with OpenCodeEnv(self.base_url, **self._client_options) as session:
                yield partial(_isolated, session)

        return await fan_out(requests, session_lane, concurrency=concurrency, progress=progress, unrun=_failed)

    def sync(self) -> SyncView:
        """A synchronous view of this client (OpenEnv's `.sync()`): `with env.sync() as s: s.run_rollout(...)`."""
        return SyncView(self)

    def __enter__(self) -> SyncView:
        """The notebook form: a connected synchronous view of this client (its own event loop thread)."""
        self._sync_view = self.sync()
        return self._sync_view.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._sync_view is not None:
            self._sync_view.__exit__(*exc)
            self._sync_view = None


async def _isolated(session: OpenCodeEnv, request: RolloutRequest) -> RolloutResult:
    try:
        result: RolloutResult = await session.run_rollout(request)
        return result
    except (RuntimeError, OSError, TimeoutError, ValueError) as error:
        return _failed(request, error)


def _failed(request: RolloutRequest, error: BaseException | None) -> RolloutResult:
    message = f"{type(error).__name__}: {error}" if error else "the rollout was not run"
    return RolloutResult(task_id=request.task_id, mode=request.mode, status="internal_error", error=message)
