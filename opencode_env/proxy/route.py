"""Where the model server is and how the proxy reaches it: its origin, and the operator's HTTP proxy in between.

`proxy_route` reads the proxy the way curl and requests do (HTTPS_PROXY / HTTP_PROXY, NO_PROXY); the capture proxy
reads only reserved names the server sets (RESERVED_PREFIX), never the standard ones a caller's env could set.
Standard library only.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

RESERVED_PREFIX = "OPENCODE_ENV_"
"""The pool's default route reads OPENCODE_ENV_HTTPS_PROXY, OPENCODE_ENV_HTTP_PROXY and OPENCODE_ENV_NO_PROXY, not
the standard names: on the cloud backends the proxy's environment carries the caller's `env`, and a caller who could
set HTTP_PROXY would be sent the operator's key. A caller cannot set an OPENCODE_* name; a server that wants its own
proxy used passes its standard variables on under these names."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    base_path: str
    connect_address: str = ""
    """Where to connect instead of resolving `host` (the address the server vetted); Host and TLS keep `host`.
    Through a proxy, the proxy is sent this address, so it does not resolve the name again either."""

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port]/path, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = _bracketed(self.host)
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def target(self) -> str:
        """host:port a proxy is asked for (CONNECT, absolute-form): the vetted address when there is one."""
        return f"{_bracketed(self.connect_address or self.host)}:{self.port}"


@dataclass(frozen=True)
class ProxyRoute:
    """An HTTP proxy between the pool and its origin."""

    scheme: Literal["http", "https"]
    """How the pool talks to the proxy itself (an https proxy: TLS to the proxy, and to an https origin inside)."""
    host: str
    port: int
    authorization: str = field(default="", repr=False)
    """Proxy-Authorization's value (Basic, from the proxy URL's user:password), or empty."""

    @classmethod
    def parse(cls, url: str) -> ProxyRoute:
        """A proxy URL as curl and requests take it: `host:port` alone means http, a missing port the scheme's."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported proxy scheme {parts.scheme!r} (http:// and https:// proxies only)")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError("the proxy URL's port is not a number from 0 to 65535") from None
        if not parts.hostname:
            raise ValueError("the proxy URL names no host")
        authorization = ""
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
        return cls("https" if parts.scheme == "https" else "http", parts.hostname, port, authorization)

    @property
    def name(self) -> str:
        """How messages name the proxy: never with its credentials."""
        return f"{self.scheme}://{_bracketed(self.host)}:{self.port}"


def proxy_route(origin: Origin, environ: Mapping[str, str], *, prefix: str = "") -> ProxyRoute | None:
    """The proxy `environ` names for `origin`, read as curl and requests read it, or None to connect directly.

    HTTPS_PROXY for an https origin, HTTP_PROXY for an http one (the lower-case name first), unless NO_PROXY lists
    the origin's host: `*`, a host (also matching its subdomains; a leading `.` or `*.` is the same), `host:port`,
    or an IP address or CIDR block matching an IP-literal host (names are not resolved for this). With a prefix,
    only the upper-case names behind it (see RESERVED_PREFIX)."""

    def read(name: str) -> tuple[str, str]:
        names = [prefix + name.upper()] if prefix else [name, name.upper()]
        return next(((key, value.strip()) for key in names if (value := environ.get(key, "")).strip()), (name, ""))

    variable, url = read(f"{origin.scheme}_proxy")
    if not url or _bypassed(origin, read("no_proxy")[1]):
        return None
    try:
        return ProxyRoute.parse(url)
    except ValueError as error:
        raise ValueError(f"{variable}: {error}") from None


def _bypassed(origin: Origin, no_proxy: str) -> bool:
    host = origin.host.lower().rstrip(".")
    address = _ip(host)
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if entry == "*":
            return True
        name, port = _split_port(entry)
        if not name or (port is not None and port != origin.port):
            continue
        if address is not None:
            with contextlib.suppress(ValueError):
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            continue
        name = name.removeprefix("*").lstrip(".").rstrip(".")
        if name and (host == name or host.endswith(f".{name}")):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port` or `1.2.3.0/24` into the name and the port (None: any port)."""
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
    elif entry.count(":") == 1:
        name, _, port = entry.partition(":")
    else:
        return entry, None
    return (name, int(port)) if port.isdigit() else (name, None)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
