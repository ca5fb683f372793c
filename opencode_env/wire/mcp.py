"""MCP servers given to the agent (Harbor's `[environment] mcp_servers`): a stdio server is a program the agent's
tools' shell starts (as the agent's tools' identity, with their environment), a remote one (sse,
streamable-http) a URL at one of the rollout's services (a compose sidecar, on the sandbox's loopback)."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_MCP_SERVERS = 8
MAX_MCP_ARGS = 64
MAX_MCP_WORD_CHARS = 4096
MAX_MCP_URL_CHARS = 2048

STDIO_REFUSED = (
    "stdio MCP servers are not supported yet: OpenCode 1.18 starts a local server, and lists its tools, before it "
    "loads its plugins, so the task's code would run while OpenCode starts and could plant a plugin in the work dir "
    "that OpenCode then loads with its token; run the server as a compose sidecar (transport = 'streamable-http', "
    "url = 'http://SERVICE:PORT/mcp')"
)
"""Tried: a stdio server that writes `.opencode/plugin/x.js` into the work dir from its first instant got the plugin
loaded, and its model calls made with OpenCode's token (tests/integration/test_mcp_servers.py)."""
McpTransport = Literal["stdio", "sse", "streamable-http"]
McpName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]
"""OpenCode names a server's tools `<name>_<tool>`, and a model's tool names are letters, digits, _ and - (64 at
most): a name is one such word of 32 at most."""
McpWord = Annotated[str, StringConstraints(min_length=1, max_length=MAX_MCP_WORD_CHARS, pattern=r"^[^\x00\n\r]*$")]


class McpServer(BaseModel):
    """One MCP server, as Harbor's task.toml declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: McpName
    transport: McpTransport = "sse"
    command: McpWord | None = Field(None, description="stdio: the program (found on the task's PATH).")
    args: list[McpWord] = Field(default_factory=list, max_length=MAX_MCP_ARGS, description="stdio: its arguments.")
    url: Annotated[str, StringConstraints(max_length=MAX_MCP_URL_CHARS)] | None = Field(
        None, description="sse, streamable-http: http://HOST:PORT/PATH, HOST one of the rollout's services."
    )

    @model_validator(mode="after")
    def _fields_fit_the_transport(self) -> McpServer:
        if self.transport == "stdio":
            if self.command is None:
                raise ValueError(f"mcp_servers.{self.name}.command: a stdio server needs the program to run")
            if self.url is not None:
                raise ValueError(f"mcp_servers.{self.name}.url: a stdio server has no URL")
            return self
        if self.url is None:
            raise ValueError(f"mcp_servers.{self.name}.url: a {self.transport} server needs its URL")
        if self.command is not None or self.args:
            raise ValueError(f"mcp_servers.{self.name}.command: a {self.transport} server is reached by URL, not run")
        url_host(self.name, self.url)
        return self


def url_host(name: str, url: str) -> str:
    """The URL's host (lower case), once the URL is plain http with a host and nothing else odd in it."""
    where = f"mcp_servers.{name}.url"
    if any(ord(char) < 0x21 or ord(char) > 0x7E for char in url):
        raise ValueError(f"{where}: only printable ASCII without spaces")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{where}: not a URL ({error})") from None
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{where}: {url[:80]!r} is not http://HOST[:PORT]/PATH (a server on the sandbox's loopback)")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise ValueError(f"{where}: no credentials or fragment in the URL")
    if port == 0:
        raise ValueError(f"{where}: port 0")
    return parts.hostname.lower()


def mcp_problems(servers: list[McpServer], service_names: frozenset[str], *, agent_runs: bool = True) -> list[str]:
    """What refuses a request's MCP servers: a name given twice; a remote server whose host is not one of the
    rollout's services (OpenCode reaches it itself, from inside the sandbox, so no other host is the task's; and a
    server of the sandbox's own, the image's entrypoint or setup's, is frozen while OpenCode starts and lists its
    tools, so it would never answer); a stdio server when the agent runs (STDIO_REFUSED; an oracle run starts no
    OpenCode, so its task's servers are simply unused)."""
    problems = []
    if agent_runs:
        problems += [f"mcp_servers.{s.name}: {STDIO_REFUSED}" for s in servers if s.transport == "stdio"]
    names = [server.name for server in servers]
    twice = sorted({name for name in names if names.count(name) > 1})
    problems += [f"mcp_servers.{name}: the name is given twice" for name in twice]
    for server in servers:
        if server.url is None:
            continue
        host = url_host(server.name, server.url)
        if host not in service_names:
            known = ", ".join(sorted(service_names)) or "none"
            problems.append(
                f"mcp_servers.{server.name}.url: host {host!r} is not one of the rollout's services ({known}): a "
                "remote MCP server must be a compose sidecar (a server the sandbox starts itself is frozen while "
                "OpenCode starts; any other host is not the task's); or declare it stdio"
            )
    return problems
