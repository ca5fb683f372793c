"""Why the endpoint probe got no answer it can use, said as a cause and a fix, before any sandbox starts: a
connection that failed (`unreachable_cause`: refused, an unknown host, TLS, a connect timeout) or a first call
answered with an error (`misaddressed_cause`: the key, the model, not an OpenAI-compatible base URL). Anything else
is left to the probe, which warns and lets the rollout run."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import urlsplit

import httpx

from opencode_env.rollout.endpoints import CATALOG, EndpointError, Upstream
from opencode_env.rollout.state import PhaseFailure
from opencode_env.settings import Settings, variable

MODELS_LISTED = 20
"""At most this many of the served model names in a message."""
SERVER_TEXT_CHARS = 200


class EndpointUnreachable(PhaseFailure):
    """The model server cannot be reached at all: nothing a rollout does would get through."""

    def __init__(self, message: str) -> None:
        super().__init__("upstream_error", "validate", message)


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _where(upstream: Upstream) -> tuple[str, str]:
    parts = urlsplit(upstream.base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", f"{parts.hostname}:{port}"


def unreachable_cause(upstream: Upstream, error: httpx.HTTPError, timeout_s: float) -> str | None:
    """The message for a connection that failed for a known cause; None for any other failure."""
    if not isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return None
    host, address = _where(upstream)
    url = upstream.base_url
    if isinstance(error, httpx.ConnectTimeout):
        return (
            f"the model server at {url} did not answer: no connection to {address} within {timeout_s:g} s. Check the "
            "address and port, that the host is up, and that no firewall drops the connection"
        )
    for cause in _causes(error):
        if isinstance(cause, ConnectionRefusedError):
            return (
                f"the model server at {url} refused the connection: nothing listens on {address}. Start the model "
                "server (for vLLM: `vllm serve MODEL --port PORT`), or fix the host and port in base_url"
            )
        if isinstance(cause, socket.gaierror):
            return (
                f"the model server's host name {host!r} (base_url {url}) does not resolve ({cause.strerror}). Fix "
                "the host name; it must resolve where the rollout runs (a server's own machine for a server)"
            )
        if isinstance(cause, ssl.SSLCertVerificationError):
            # The probe trusts its own CA bundle and the proxy the system's: a private CA may pass where the
            # calls are made, so a certificate the probe cannot verify is not a refusal.
            return None
        if isinstance(cause, ssl.SSLError):
            return (
                f"TLS with the model server at {url} failed ({cause.reason or cause}). A plain-HTTP server (vLLM's "
                "default) takes http://, not https://"
            )
    return None


def raise_if_unreachable(upstream: Upstream, error: httpx.HTTPError, timeout_s: float) -> None:
    """The probe's hook for a failed connection: a known cause ends the rollout here."""
    cause = unreachable_cause(upstream, error, timeout_s)
    if cause is not None:
        raise EndpointUnreachable(cause)


def _key_source(upstream: Upstream) -> str:
    defaults = CATALOG.get(upstream.endpoint)
    if upstream.key_from_server and defaults is not None:
        return f"the server's {variable(defaults.read(Settings.model_construct()).setting_names[1])}"
    return "the request's api_key (on the command line: --api-key-env VAR, the variable that holds it)"


def _server_text(response: httpx.Response) -> str:
    text = response.text[:SERVER_TEXT_CHARS].replace("\n", " ")
    return f"HTTP {response.status_code}: {text}" if text else f"HTTP {response.status_code}"


def served_models(body: bytes) -> list[str] | None:
    """The model ids an OpenAI-compatible `/models` answer lists; None when it is not such an answer."""
    try:
        listed = json.loads(body).get("data")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    if not isinstance(listed, list):
        return None
    return [str(entry["id"]) for entry in listed if isinstance(entry, dict) and "id" in entry]


def misaddressed_cause(upstream: Upstream, answer: httpx.Response, models: list[str] | None) -> str | None:
    """The message for a first answer that says the request went to the wrong place, with the wrong key or for a
    model the server does not serve; None for any other answer. `models`: what the server's `/models` lists."""
    status, url = answer.status_code, upstream.base_url
    if status in (401, 403):
        if not upstream.api_key:
            return (
                f"the model server at {url} wants a key ({_server_text(answer)}) and none was sent: give "
                f"{_key_source(upstream)}"
            )
        return f"the model server at {url} refused the key ({_server_text(answer)}): check {_key_source(upstream)}"
    if status not in (400, 404, 422):
        return None
    names_the_model = status == 404 or upstream.model in answer.text[: SERVER_TEXT_CHARS * 10]
    if models is not None and upstream.model not in models and names_the_model:
        shown = ", ".join(repr(name[:120]) for name in models[:MODELS_LISTED])
        more = f" and {len(models) - MODELS_LISTED} more" if len(models) > MODELS_LISTED else ""
        served = f"it serves {shown}{more}" if models else "its /models lists none"
        return (
            f"the model server at {url} does not serve model {upstream.model!r} ({_server_text(answer)}); {served}. "
            "Give one of them as model (--model on the command line)"
        )
    if status == 404:
        return (
            f"{url}/chat/completions answered {_server_text(answer)}: base_url is not an OpenAI-compatible API. It "
            "is the address before /chat/completions, for vLLM http://HOST:PORT/v1"
        )
    return None


async def raise_if_misaddressed(
    upstream: Upstream, answer: httpx.Response, get: Callable[[str], Awaitable[httpx.Response]]
) -> None:
    """The probe's hook for a first answer that is not 200: a wrong URL, key or model ends the rollout here.
    `get`: the probe's own GET (its address, key and proxy), for the server's `/models`."""
    if answer.status_code not in (400, 401, 403, 404, 422):
        return
    models = None
    if answer.status_code not in (401, 403):
        try:
            listing = await get(f"{upstream.base_url}/models")
        except httpx.HTTPError:
            listing = None
        if listing is not None and listing.status_code == 200:
            models = served_models(listing.content)
    cause = misaddressed_cause(upstream, answer, models)
    if cause is not None:
        raise EndpointError(cause)
