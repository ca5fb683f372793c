"""A request's MCP servers as OpenCode's `mcp` config (pure): each is a remote server at one of the rollout's
services, whose name (which OpenCode does not resolve) becomes 127.0.0.1: services share the sandbox's loopback.
(stdio servers are refused for an agent run: wire/mcp.py's STDIO_REFUSED.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opencode_env.wire.mcp import McpServer

MCP_TIMEOUT_MS = 60_000
"""OpenCode's limit on each request to a server (its tool list included); its default, 5 s, is short on a loaded
machine."""


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
