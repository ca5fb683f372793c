"""`OpenEnvOpenCode`: the client as openenv-core's own `MCPToolClient` (where openenv-core is installed: the
`server` extra), for code written against OpenEnv's client: `from_docker_image`, `from_env`, `reset`, `step`,
`list_tools`, `call_tool` and `.sync()` are OpenEnv's; it adds `run_rollout`, `run_rollouts` and `from_hub`.

It connects as `OpenCodeEnv` does (the bearer token, the wait for a loading server, a model server recognised) and
waits each rollout's own budget; importing it loads openenv-core, which `opencode_env.OpenCodeEnv` never does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

try:
    from openenv.core.mcp_client import MCPToolClient
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        "opencode_env.client.openenv is OpenEnv's MCPToolClient and needs openenv-core: "
        "pip install 'opencode-env[server]' (or openenv-core); opencode_env.OpenCodeEnv works without it",
        name=missing.name,
    ) from missing

from opencode_env.client.client import (
    DEFAULT_MESSAGE_TIMEOUT_S,
    OpenCodeEnv,
    as_request,
    call_rollout,
    server_root,
    space_url,
)
from opencode_env.client.ws_session import OpenEnvSession
from opencode_env.settings import variable
from opencode_env.wire import RolloutRequest, RolloutResult, RunnerCapabilities

__all__ = ["OpenEnvOpenCode"]


class OpenEnvOpenCode(MCPToolClient):  # type: ignore[misc]
    """An opencode-env server's client that is an `openenv.core.mcp_client.MCPToolClient`."""

    _ws: Any
    _message_timeout: float

    def __init__(
        self,
        base_url: str,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S,
        provider: Any = None,
        mode: str | None = None,
        *,
        token: str | None = None,
        ready_timeout_s: float = 300.0,
    ) -> None:
        root = server_root(base_url)
        super().__init__(
            root, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s, provider=provider, mode=mode
        )
        self.base_url = root
        self._token = token if token is not None else os.environ.get(variable("token"), "")
        self._ready_timeout = ready_timeout_s

    @classmethod
    def from_hub(cls, repo_id: str, **options: Any) -> OpenEnvOpenCode:
        """A client of the running Space named `repo_id` ("owner/space" -> https://owner-space.hf.space).
        (`from_env` is OpenEnv's: it runs the Space's image here.)"""
        return cls(space_url(repo_id), **options)

    async def connect(self) -> OpenEnvOpenCode:
        if self._ws is None:
            session = OpenEnvSession(
                self.base_url,
                token=self._token,
                connect_timeout_s=self._connect_timeout,
                max_message_size_mb=self._max_message_size / (1024 * 1024),
                ready_timeout_s=self._ready_timeout,
            )
            self._ws = (await session.connect()).websocket
        return self

    @property
    def capabilities(self) -> RunnerCapabilities:
        return self._plain().capabilities

    async def run_rollout(self, request: RolloutRequest | None = None, **fields: Any) -> RolloutResult:
        """Run one rollout on this session; pass a RolloutRequest or its fields as keyword arguments."""
        return await call_rollout(self, as_request(request, fields))

    async def run_rollouts(
        self, requests: Sequence[RolloutRequest], *, max_concurrency: int | None = None, progress: bool = True
    ) -> list[RolloutResult]:
        """Many rollouts over sessions of their own (see `OpenCodeEnv.run_rollouts`)."""
        return await self._plain().run_rollouts(requests, max_concurrency=max_concurrency, progress=progress)

    def _plain(self) -> OpenCodeEnv:
        return OpenCodeEnv(
            self.base_url,
            token=self._token,
            connect_timeout_s=self._connect_timeout,
            message_timeout_s=self._message_timeout,
            ready_timeout_s=self._ready_timeout,
        )
