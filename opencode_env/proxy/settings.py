"""What one capture proxy is told at start (`__main__` builds it from its arguments and environment)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opencode_env.proxy.peers import PeerOwners
from opencode_env.proxy.request import RewriteConfig


@dataclass(frozen=True)
class ProxySettings:
    upstream_url: str
    trace_path: str
    api_key: str = ""
    trace_max_bytes: int = 0
    """The trace never passes this many bytes (0: unbounded): later turns are relayed, counted, not recorded."""
    rewrite: RewriteConfig = field(default_factory=RewriteConfig)
    idle_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    access_token: str = ""
    max_unreachable: int = 3
    max_server_errors: int = 20
    upstream_address: str = ""
    """Connect to this address rather than resolving the upstream URL's host again (see Origin.connect_address)."""
    max_request_bytes: int = 32 * 2**20
    """A request body over this is answered 413 and recorded as the agent's doing, read no further."""
    peers: PeerOwners | None = None
    """Where set, a call from a socket any other uid owns is refused (403): only OpenCode itself calls the model."""
    token_in: str = ""
    """Send agent turns' prompts as token ids (see token_in.py): "" off; a route the probe proved ("tokens",
    "forwarded"); "auto" every route tried in turn (no probe); "none" no route (every turn records why)."""
    token_in_unavailable: str = ""
    """With token_in "none": why the server offers no route (the probe's finding), recorded on every turn."""
    template_check: bool = False
    """Fingerprint the chat template (the server's /tokenize of a fixed conversation) beside every call."""
    policy_version_header: str = ""
    """A response header (lower case) holding the engine's policy version, recorded per turn."""

    def __repr__(self) -> str:
        return f"ProxySettings(upstream_url={self.upstream_url!r}, trace_path={self.trace_path!r})"
