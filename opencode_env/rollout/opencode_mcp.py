"""A request's MCP servers as OpenCode's `mcp` config (pure): each is a remote server at one of the rollout's
services, whose name (which OpenCode does not resolve) becomes 127.0.0.1: services share the sandbox's loopback.
(stdio servers are refused for an agent run: wire/mcp.py's STDIO_REFUSED.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opencode_env.wire.mcp import McpServer

MCP_TIMEOUT_MS = 60_000
"""OpenCode's limit on each request to a server (its tool list included); its default, 5 s, is short on a loaded
machine."""
ONE_REQUEST_PER_CONNECTION = {"Connection": "close"}
"""Headers on each of OpenCode's requests to a server. OpenCode 1.18 sends a request on a connection it kept from the
last answer even when the server (HTTP/1.0, one request per connection) is about to close it; the request is lost,
OpenCode marks the server failed and never retries, and the agent runs without its tools (6 of 32 rollouts of
tests/harbor_corpus/mcp-sidecar at load 8, every one when the server closes 2 s after answering; none with this)."""


def mcp_config(servers: Sequence[McpServer]) -> dict[str, Any]:
    """OpenCode's `mcp` table for `servers` (empty when there are none)."""
    config: dict[str, Any] = {}
    for server in servers:
        if server.url is None:
            raise ValueError(f"mcp_servers.{server.name}: only remote servers are given to OpenCode")
        config[server.name] = {
            "type": "remote",
            "url": on_loopback(server.url),
            "oauth": False,
            "timeout": MCP_TIMEOUT_MS,
            "headers": dict(ONE_REQUEST_PER_CONNECTION),
        }
    return config


def on_loopback(url: str) -> str:
    """The URL with its host replaced by 127.0.0.1 (its port, path and query kept)."""
    parts = urlsplit(url)
    netloc = "127.0.0.1" if parts.port is None else f"127.0.0.1:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def servers_without_tools(servers: Sequence[McpServer], sent_tools: Iterable[object]) -> list[str]:
    """The servers none of whose tools (`<name>_<tool>`, OpenCode's naming; a tool is the longest such name's) is
    among the tool schemas the agent sent the model (the proxy's record): OpenCode could not start or list them,
    and went on without them."""
    longest_first = sorted((server.name for server in servers), key=len, reverse=True)
    served = set()
    for schema in sent_tools:
        function = schema.get("function") if isinstance(schema, dict) else None
        tool = function.get("name") if isinstance(function, dict) else None
        if isinstance(tool, str):
            served |= {next((name for name in longest_first if tool.startswith(f"{name}_")), "")}
    return [server.name for server in servers if server.name not in served]


def unserved_servers(servers: Sequence[McpServer], request_tools: Mapping[str, Sequence[object]]) -> list[str]:
    """The servers none of whose tools was in any request OpenCode sent the model (the proxy's record, keyed by tool
    set); none when it sent no request, which leaves nothing to tell by."""
    if not request_tools:
        return []
    return servers_without_tools(servers, [schema for schemas in request_tools.values() for schema in schemas])
