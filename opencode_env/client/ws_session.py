"""A session on an OpenEnv server's `/ws` WebSocket: reset, step, state, list_tools, call_tool.

The same protocol as openenv-core's `MCPToolClient`, spoken with `websockets` alone: importing openenv-core's client
loads its server side too (FastAPI, FastMCP, Gradio, pandas: seconds), which a client has no use for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from opencode_env.wire import READY_PATH, STARTING

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_RETRY_AFTER_S = 2.0
REFUSED_RETRY_S = 0.25


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)


class ServerError(RuntimeError):
    """The server answered with an error (a tool's failure, a bad action, a full server)."""


def http_url(base_url: str) -> str:
    parts = urlsplit(base_url.rstrip("/"))
    scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path, "", ""))


def nobody_at(url: str) -> str:
    return (
        f"nothing answers at {url}: is a server running there? Start one with `opencode-env serve` "
        "(or run rollouts in-process with opencode_env.run_rollout, no server needed)"
    )


def _retry_after_s(header: str | None) -> float:
    try:
        return max(float(header or DEFAULT_RETRY_AFTER_S), 0.1)
    except ValueError:
        return DEFAULT_RETRY_AFTER_S


def _reason(body: bytes) -> str:
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return ""
    return str(answer.get("error") or "") if isinstance(answer, dict) else ""


def websocket_url(base_url: str) -> str:
    parts = urlsplit(base_url.rstrip("/"))
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, f"{parts.path}/ws", "", ""))


class OpenEnvSession:
    def __init__(
        self,
        base_url: str,
        *,
        token: str = "",
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        max_message_size_mb: float = 100.0,
        ready_timeout_s: float = 300.0,
    ) -> None:
        self.base_url = base_url
        self._ws_url = websocket_url(base_url)
        self._token = token
        self._connect_timeout = connect_timeout_s
        self._ready_timeout = ready_timeout_s
        self._message_timeout = message_timeout_s
        self._max_message_size = int(max_message_size_mb * 1024 * 1024)
        self._ws: ClientConnection | None = None
        self._lock = asyncio.Lock()

    async def connect(self) -> OpenEnvSession:
        """Open the WebSocket, sending the bearer token when there is one; a server that is still loading is waited
        for (see `wait_until_ready`)."""
        if self._ws is not None:
            return self
        await self.wait_until_ready()
        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=headers,
                # A proxy from the environment is never used to reach this machine.
                proxy=None if urlsplit(self._ws_url).hostname in LOCAL_HOSTS else True,
            )
        except InvalidStatus as refused:
            served = await served_models(self.base_url, self._connect_timeout) if _absent(refused) else None
            if served is not None:
                raise ConnectionError(model_server_at(self.base_url, served)) from refused
            raise ConnectionError(f"{self._ws_url} refused the connection: {refusal_reason(refused)}") from refused
        except ConnectionRefusedError as error:
            raise ConnectionError(nobody_at(self._ws_url)) from error
        except (OSError, InvalidHandshake, TimeoutError) as error:
            raise ConnectionError(f"failed to connect to {self._ws_url}: {error}") from error
        return self

    @property
    def websocket(self) -> ClientConnection:
        """The open connection (after `connect`), for a client that speaks on it itself."""
        if self._ws is None:
            raise ConnectionError(f"not connected to {self._ws_url}")
        return self._ws

    async def wait_until_ready(self) -> None:
        """Ask the server's readiness route (answered at once, even while it loads): while it says it is starting,
        wait as long as its Retry-After says, and while nothing listens yet on this machine (connection refused)
        retry every quarter second within the connect timeout (elsewhere, refused is an answer); all of it for at
        most `ready_timeout_s`. A server that could not start is an error with its reason at once. A server without
        the route (404) is taken as ready."""
        import httpx

        url = http_url(self.base_url) + READY_PATH
        started = asyncio.get_running_loop().time()
        deadline = started + self._ready_timeout
        local = urlsplit(url).hostname in LOCAL_HOSTS
        refused_deadline = started + (min(self._ready_timeout, self._connect_timeout) if local else 0.0)
        async with httpx.AsyncClient(timeout=self._connect_timeout, trust_env=not local) as http:
            while True:
                try:
                    answer = await http.get(url)
                except httpx.ConnectError as error:
                    # A server starting beside its client binds its port a few seconds after it starts (~2.4 s
                    # after `serve` here): refused is "not yet" within the connect timeout, like a 503; past it,
                    # nobody is there (an eval or an example pointed at no server says so in seconds).
                    if asyncio.get_running_loop().time() + REFUSED_RETRY_S > refused_deadline:
                        raise ConnectionError(nobody_at(url)) from error
                    await asyncio.sleep(REFUSED_RETRY_S)
                    continue
                except httpx.HTTPError as error:
                    raise ConnectionError(f"failed to reach {url}: {error}") from error
                if answer.status_code != 503:
                    return
                reason = _reason(answer.content) or f"HTTP {answer.status_code}"
                if reason != STARTING:
                    raise ConnectionError(f"{url}: {reason}")
                delay = _retry_after_s(answer.headers.get("retry-after"))
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise ConnectionError(f"{url}: still starting after {self._ready_timeout:.0f} s ({reason})")
                await asyncio.sleep(delay)

    async def close(self) -> None:
        if self._ws is None:
            return
        ws, self._ws = self._ws, None
        # Saying "close" lets the server free the session at once; a server already gone needs no goodbye.
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps({"type": "close"}))
        await ws.close()

    disconnect = close

    async def __aenter__(self) -> OpenEnvSession:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.connect()
        assert self._ws is not None
        async with self._lock:
            await self._ws.send(json.dumps(message))
            try:
                raw = await asyncio.wait_for(self._ws.recv(), timeout=self._message_timeout)
            except ConnectionClosed as closed:
                raise ConnectionError(f"the server closed the session: {closed}") from closed
        response: dict[str, Any] = json.loads(raw)
        if response.get("type") == "error":
            error = response.get("data") or {}
            raise ServerError(f"Server error: {error.get('message', 'unknown')} (code: {error.get('code', '-')})")
        data: dict[str, Any] = response.get("data") or {}
        return data

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        return await self._exchange({"type": "reset", "data": kwargs})

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return await self._exchange({"type": "step", "data": action})

    async def state(self) -> dict[str, Any]:
        return await self._exchange({"type": "state"})

    async def list_tools(self) -> list[Tool]:
        observation = (await self.step({"type": "list_tools"})).get("observation") or {}
        return [
            Tool(
                name=tool.get("name", ""),
                description=tool.get("description") or "",
                input_schema=tool.get("input_schema") or tool.get("inputSchema") or {},
            )
            for tool in observation.get("tools", [])
        ]

    async def call_tool(self, name: str, **arguments: Any) -> Any:
        """The tool's data (what its return value serialized to); a tool's failure raises ServerError."""
        payload = await self.step({"type": "call_tool", "tool_name": name, "arguments": arguments})
        observation = payload.get("observation") or {}
        error = observation.get("error")
        if error:
            raise ServerError(f"Tool '{name}' failed: {error.get('message', error)}")
        result = observation.get("result")
        if isinstance(result, dict) and "data" in result:
            return result["data"]
        return result


def _absent(refused: InvalidStatus) -> bool:
    return refused.response.status_code in (403, 404, 405)


def model_server_at(base_url: str, served: list[str]) -> str:
    shown = ", ".join(served[:5]) + (f" and {len(served) - 5} more" if len(served) > 5 else "")
    return (
        f"{base_url} is a model server (OpenAI-compatible: its /models lists {shown or 'no model'}), not an "
        "opencode-env server: give it to the rollout as base_url (with its model), and give OpenCodeEnv the URL of "
        "an opencode-env server (`opencode-env serve`, or a Space's https://NAME.hf.space)"
    )


async def served_models(base_url: str, timeout_s: float) -> list[str] | None:
    """The model ids an OpenAI-compatible server at `base_url` lists (at its /models, or /v1/models under its root);
    None when it is not one. Asked only after the server refused the /ws route."""
    import httpx

    root = http_url(base_url)
    origin = urlunsplit((*urlsplit(root)[:2], "", "", ""))
    candidates = dict.fromkeys([f"{root}/models", f"{origin}/v1/models"])
    local = urlsplit(root).hostname in LOCAL_HOSTS
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=not local) as http:
        for url in candidates:
            try:
                answer = await http.get(url)
                listing = answer.json() if answer.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue
            if not isinstance(listing, dict) or listing.get("object") != "list":
                continue
            data = listing.get("data")
            if isinstance(data, list):
                return [str(entry.get("id")) for entry in data if isinstance(entry, dict)]
    return None


def refusal_reason(refused: InvalidStatus) -> str:
    """The server's own explanation, from the body of its refusal, else the HTTP status."""
    response = refused.response
    return _reason(bytes(response.body or b"")) or f"HTTP {response.status_code}"
