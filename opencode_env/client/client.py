"""The client: `OpenCodeEnv(base_url=...)`, a session on the server's OpenEnv WebSocket for the `run_rollout` tool.

It speaks OpenEnv's `/ws` protocol itself (`ws_session`) and imports nothing of the pipeline, so that importing it
takes a fraction of a second rather than the seconds openenv-core's client costs (it loads its server side too).

Three forms work, each against a real server:

    async with OpenCodeEnv(base_url=url) as env:        # async
        result = await env.run_rollout(instruction=..., verify=[...])
    with OpenCodeEnv(base_url=url).sync() as env:       # OpenEnv's sync wrapper
        result = env.run_rollout(...)
    with OpenCodeEnv(base_url=url) as env:              # notebook form, also inside a running event loop
        result = env.run_rollout(...)

It is a runner (wire/runner.py, beside `InProcess` and the cluster's `RayRollouts`): an eval, TRL's rollout_func and
the examples take it as they take the others. A client never entered (`async with`) runs each `run_rollout` in a
session of its own, so that calls run at once and a server restarting mid-run fails only the calls it cut; an entered
one runs its calls on its session, one at a time.

Each call's wait follows its own budget (the rollout's deadline plus a margin larger than the server's), so the
client never gives up before the server does.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opencode_env.client.by_reference import ResultFetchError, answer_of, fetch_result
from opencode_env.client.sync_view import SyncView
from opencode_env.client.ws_session import OpenEnvSession, ServerError, Tool
from opencode_env.settings import variable
from opencode_env.wire import TOOL_NAME, RolloutRequest, RolloutResult, RunnerCapabilities, total_budget_s

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


def client_timeout_s(request: RolloutRequest) -> float:
    return total_budget_s(request) + CLIENT_MARGIN_S


def parse_result(data: Any) -> RolloutResult:
    """The tool's answer as a RolloutResult; anything else is an error, never a guess."""
    if not isinstance(data, dict):
        raise RolloutAnswerError(f"run_rollout answered with {type(data).__name__}, not a RolloutResult object")
    return RolloutResult.model_validate(data)


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
        if request is None:
            request = RolloutRequest.model_validate(fields)
        elif fields:
            raise TypeError("pass either a RolloutRequest or keyword fields, not both")
        if self._ws is None:
            async with OpenCodeEnv(self.base_url, **self._client_options) as session:
                return await session.run_rollout(request)
        previous = self._message_timeout
        self._message_timeout = max(previous, client_timeout_s(request))
        try:
            data = await self.call_tool(TOOL_NAME, **request.model_dump(mode="json"))
        finally:
            self._message_timeout = previous
        answer = answer_of(data)
        if answer is None:
            return parse_result(data)
        return await fetch_result(self.base_url, answer, token=self._token, connect_timeout_s=self._connect_timeout)

    async def run_rollouts(
        self, requests: Sequence[RolloutRequest], *, max_concurrency: int | None = None, progress: bool = True
    ) -> list[RolloutResult]:
        """Run many rollouts (a GRPO group) over up to `max_concurrency` sessions (None: 4); results come back in
        order.

        A rollout that fails, or whose session fails, gets its own result with the error; the others go on.
        """
        max_concurrency = DEFAULT_CONCURRENCY if max_concurrency is None else max_concurrency
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        results: list[RolloutResult | None] = [None] * len(requests)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for index in range(len(requests)):
            queue.put_nowait(index)
        bar = _ProgressBar(len(requests), enabled=progress)

        async def worker() -> None:
            async with OpenCodeEnv(self.base_url, **self._client_options) as session:
                while not queue.empty():
                    index = queue.get_nowait()
                    results[index] = await _isolated(session, requests[index])
                    bar.advance(results[index])

        workers = [asyncio.ensure_future(worker()) for _ in range(min(max_concurrency, len(requests)))]
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
        bar.close()
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        return [
            result if result is not None else _failed(request, failure)
            for result, request in zip(results, requests, strict=True)
        ]

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


class _ProgressBar:
    def __init__(self, total: int, *, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr)

    def advance(self, result: RolloutResult | None) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"last: {result.status if result else '-'}")
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
