"""Who may use this server and who each caller is, decided per request for every route but `/health` (HTTP, MCP and
WebSocket).

With a token (OPENCODE_ENV_TOKEN), every request must carry a bearer credential: the token itself is the operator's
(it sees every run), and a caller token (`caller_token(token, name)`, issued by `POST /callers` to the operator)
is one caller's, who sees only the runs it started. Callers are told apart by their credential, not by a session:
the /web list is read by a browser outside any MCP session, OpenEnv's `/step` has no session, and a run outlives
the connection that started it (its row is kept across restarts); a credential is the same on every transport and
every day. A caller token is an HMAC of the caller's name under the operator's token, so the server keeps no table of
callers (a Space restarts with nothing on disk) and no caller token reveals the operator's, or another caller's.

Without a token, only connections from this machine are served (every backend runs commands or spends the owner's
money for whoever reaches it), unless OPENCODE_ENV_ALLOW_UNAUTHENTICATED=1 says the network is trusted; and since a
browser on this machine is a way in for any web page it visits, such a server admits browsers only from its own
origin (CSRF) and only under its own host names (DNS rebinding): `BrowserRule`. The rule lives in the app itself, so
`uvicorn opencode_env.server.app:app --host 0.0.0.0` obeys it too, and the server always starts and explains itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opencode_env.settings import variable
from opencode_env.viewer.rows import OPERATOR, Caller
from opencode_env.viewer.web import WEB_OPEN_PATHS

OPEN_PATHS = frozenset({"/health"}) | WEB_OPEN_PATHS
# A request relayed by a proxy may come from anywhere, whatever the address of the hop that relayed it.
FORWARDING_HEADERS = frozenset({b"forwarded", b"x-forwarded-for", b"x-real-ip"})
CALLER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CALLER_TOKEN_PREFIX = "occ1"
ANONYMOUS = Caller(id="anonymous")
"""Everyone on a server open without a token: they cannot be told apart, so they share one list."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
BROWSER_SITES = frozenset({"same-origin", "none"})
"""`Sec-Fetch-Site` values of a request this server's own page made, or that the user typed."""


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


def caller_token(operator_token: str, name: str) -> str:
    """The credential of caller `name` on the server whose token is `operator_token`."""
    if not CALLER_NAME.match(name):
        raise ValueError(f"a caller's name is 1-64 letters, digits, '_' or '-', got {name[:80]!r}")
    return f"{CALLER_TOKEN_PREFIX}.{name}.{_mac(operator_token, name)}"


def withdrawn(name: str) -> str:
    return (
        f"the token of caller {name!r} is withdrawn ({variable('revoked_callers')}); the operator can issue one "
        "under another name"
    )


def revoked_names(listed: str) -> frozenset[str]:
    """The names of OPENCODE_ENV_REVOKED_CALLERS (comma-separated)."""
    return frozenset(name.strip() for name in listed.split(",") if name.strip())


def _mac(operator_token: str, name: str) -> str:
    digest = hmac.new(operator_token.encode(), f"opencode-env caller {name}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class BrowserRule:
    """What a server without a token admits of browsers: requests from its own origin only (a page elsewhere cannot
    make this machine's browser post to it), under its own host names only (a name of the attacker's that resolves
    here, DNS rebinding, is refused). Requests without an Origin (curl, the SDKs) are not a browser's."""

    host_names: frozenset[str]
    """Names this server answers to besides IP literals (which a rebinding attack cannot use: it needs a name)."""

    @classmethod
    def of_this_machine(cls, extra: str = "") -> BrowserRule:
        names = {name.strip().lower().rstrip(".") for name in extra.split(",") if name.strip()}
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return cls(host_names=frozenset(LOOPBACK_NAMES | names))

    def check(self, headers: dict[bytes, bytes], method: str) -> Refusal | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if host and not self._ours(_hostname(host)):
            return Refusal(
                403,
                f"this server has no token and answers only to its own names, not {host[:100]!r} (a name that "
                f"resolves here is how a web page reaches it: DNS rebinding); add the name to "
                f"{variable('allowed_hosts')}, or set {variable('token')}",
            )
        origin = headers.get(b"origin")
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        if origin is not None and not _same_origin(origin.decode("latin-1"), host):
            return Refusal(403, _cross_site(f"from {origin.decode('latin-1')[:100]!r}"))
        if site and site not in BROWSER_SITES:
            return Refusal(403, _cross_site(f"({site} by the browser's own account)"))
        if method == "POST" and _media_type(headers) != "application/json":
            return Refusal(
                415,
                "this server has no token and takes a POST only as `Content-Type: application/json` (what any web "
                "page may post across sites, a form or text/plain, is refused)",
            )
        return None

    def _ours(self, name: str) -> bool:
        if _is_ip(name):
            return True
        return name in self.host_names or name.endswith(".localhost")


def _cross_site(where: str) -> str:
    return (
        f"this server has no token and serves browsers only from its own pages: a request {where} is refused "
        f"(set {variable('token')} to serve other origins with a bearer token)"
    )


def _media_type(headers: dict[bytes, bytes]) -> str:
    return headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()


def _hostname(host: str) -> str:
    """The name of a Host header's value (no port, no brackets), lower case."""
    parts = urlsplit(f"//{host}")
    try:
        return (parts.hostname or "").rstrip(".")
    except ValueError:
        return host.lower()


def _same_origin(origin: str, host: str) -> bool:
    """Whether a browser's Origin is this server as the request's Host names it (scheme-default ports filled in)."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not host:
        return False
    default = 443 if parts.scheme == "https" else 80
    served = urlsplit(f"//{host}")
    try:
        return (parts.hostname, parts.port or default) == (served.hostname, served.port or default)
    except ValueError:
        return False


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AccessPolicy:
    token: str
    allow_unauthenticated: bool
    risk: str
    """What the backend does for whoever reaches the server (the sandbox registry's words)."""
    browsers: BrowserRule = field(default_factory=lambda: BrowserRule(host_names=LOOPBACK_NAMES))
    """Applied without a token (with one, no browser sends the credential on its own)."""
    revoked: frozenset[str] = frozenset()
    """Callers refused (OPENCODE_ENV_REVOKED_CALLERS): a derived token is never deleted, only refused."""

    def admit(
        self, headers: list[tuple[bytes, bytes]], client_host: str | None, method: str = "GET"
    ) -> Caller | Refusal:
        """Who sent this request, or why it may not proceed."""
        named = {name.lower(): value for name, value in headers}
        if self.token:
            return self._caller_of(named)
        if not (self.allow_unauthenticated or (is_loopback(client_host) and not _forwarded(named))):
            return Refusal(
                403,
                f"this server {self.risk} for anyone who reaches it, and it has no access token: set "
                f"{variable('token')} on the server and send it as `Authorization: Bearer <token>`, or set "
                f"{variable('allow_unauthenticated')}=1 if the network is trusted (connections from the server's own "
                "machine are served without a token)",
            )
        refusal = self.browsers.check(named, method)
        if refusal is not None:
            return refusal
        return ANONYMOUS if self.allow_unauthenticated else OPERATOR

    def check(self, headers: list[tuple[bytes, bytes]], client_host: str | None, method: str = "GET") -> Refusal | None:
        """Why this request may not proceed, or None."""
        admitted = self.admit(headers, client_host, method)
        return admitted if isinstance(admitted, Refusal) else None

    def _caller_of(self, headers: dict[bytes, bytes]) -> Caller | Refusal:
        presented = headers.get(b"authorization")
        if presented is None:
            return Refusal(
                401, f"this server needs its access token: send `Authorization: Bearer <{variable('token')}>`"
            )
        scheme, _, credentials = presented.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return Refusal(
                401, f"the Authorization header must use the Bearer scheme with the server's {variable('token')}"
            )
        credential = credentials.strip()
        if hmac.compare_digest(credential, self.token.encode()):
            return OPERATOR
        prefix, _, rest = credential.decode("latin-1").partition(".")
        name, _, mac = rest.rpartition(".")
        ours = prefix == CALLER_TOKEN_PREFIX and CALLER_NAME.match(name)
        if ours and hmac.compare_digest(mac.encode(), _mac(self.token, name).encode()):
            if name in self.revoked:
                return Refusal(401, withdrawn(name))
            return Caller(id=f"caller:{name}")
        return Refusal(
            401,
            f"the bearer token does not match the server's {variable('token')}, nor is it a caller token the server "
            "issued",
        )


def _forwarded(headers: dict[bytes, bytes]) -> bool:
    return any(name in FORWARDING_HEADERS for name in headers)


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
