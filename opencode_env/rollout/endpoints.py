"""The endpoint catalog: where the policy model lives. The request's own values win over the operator's settings
(VLLM_URL, OPENAI_API_KEY, ...), the settings over the catalog's defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from opencode_env.scripted.builtin import BUILTIN_MODEL, builtin_scripted_url
from opencode_env.settings import Settings, variable
from opencode_env.wire import EndpointName, RolloutRequest, UpstreamInfo

SCRIPTED = BUILTIN_MODEL
"""The model name of the built-in scripted model (scripted/builtin.py), given with no base URL."""
BUILTIN_KEY = "sk-scripted-not-a-secret"


class EndpointError(ValueError):
    """The request does not say enough to reach a model; the message names what is missing."""


@dataclass(frozen=True)
class EndpointSettings:
    """What the operator set for one endpoint: its URL, key and model, and the settings (fields of Settings) they
    came from, for messages that name the variables."""

    url: str
    api_key: str
    model: str
    setting_names: tuple[str, str, str]


def _vllm(settings: Settings) -> EndpointSettings:
    return EndpointSettings(
        settings.vllm_url,
        settings.vllm_api_key.get_secret_value(),
        settings.vllm_model,
        ("vllm_url", "vllm_api_key", "vllm_model"),
    )


def _openai(settings: Settings) -> EndpointSettings:
    return EndpointSettings(
        settings.openai_base_url,
        settings.openai_api_key.get_secret_value(),
        settings.openai_model,
        ("openai_base_url", "openai_api_key", "openai_model"),
    )


def _hf_router(settings: Settings) -> EndpointSettings:
    return EndpointSettings(
        settings.hf_router_base_url,
        settings.hf_router_api_key.get_secret_value(),
        settings.hf_router_model,
        ("hf_router_base_url", "hf_router_api_key", "hf_router_model"),
    )


@dataclass(frozen=True)
class EndpointDefaults:
    read: Callable[[Settings], EndpointSettings]
    """The operator's settings for this endpoint, read as typed fields."""
    default_url: str = ""
    key_required: bool = True
    thinking_disabled_by_default: bool = False

    def configured(self, settings: Settings) -> tuple[str, str, str]:
        """The operator's URL, key and model for this endpoint."""
        own = self.read(settings)
        return own.url or self.default_url, own.api_key, own.model

    def variables(self) -> str:
        return " / ".join(variable(name) for name in self.read(Settings.model_construct()).setting_names)


CATALOG: dict[str, EndpointDefaults] = {
    "vllm": EndpointDefaults(_vllm, key_required=False, thinking_disabled_by_default=True),
    "openai": EndpointDefaults(_openai, "https://api.openai.com/v1"),
    "hf_router": EndpointDefaults(_hf_router, "https://router.huggingface.co/v1"),
}


@dataclass(frozen=True)
class Upstream:
    endpoint: EndpointName
    base_url: str
    api_key: str
    model: str
    disable_thinking: bool
    from_caller: bool = False
    """The base URL came from the request rather than from the operator's configuration (see upstream_policy)."""
    key_from_server: bool = False
    """The key came from the server's environment, not from the request."""
    connect_address: str = ""
    """The address the policy vetted for a caller's URL: the proxy connects there, never resolving the name again."""
    return_token_ids: bool | None = None
    """Whether the proxy asks for `return_token_ids`, as the endpoint probe found it accepted; None: not probed."""
    template_check: bool = False
    """The server fingerprints its chat template (`/tokenize`): the proxy checks it on every call."""
    token_in_route: str = "auto"
    """In token-in mode, the route the probe proved ("tokens", "forwarded"), "none" when it proved none, "auto" when
    it did not look (the proxy then tries each in turn)."""
    token_in_unavailable: str = ""
    """With token_in_route "none": why, recorded by the proxy on every turn."""

    def host_port(self) -> tuple[tuple[str, int], ...]:
        """The one host:port the sandbox may reach in black_box mode."""
        parsed = urlsplit(self.base_url)
        default = 443 if parsed.scheme == "https" else 80
        return (((parsed.hostname or "").lower(), parsed.port or default),)

    def info(self) -> UpstreamInfo:
        return UpstreamInfo(
            endpoint=self.endpoint, base_url=self.base_url, model=self.model, disable_thinking=self.disable_thinking
        )

    def __repr__(self) -> str:
        return f"Upstream(endpoint={self.endpoint!r}, base_url={self.base_url!r}, model={self.model!r})"


def _server_key(request: RolloutRequest, base_url: str, configured_url: str, server_key: str) -> str:
    """A key from the server's environment goes only to the URL configured beside it, and never into a sandbox
    (black_box mode hands the key to the agent itself)."""
    if request.mode == "black_box":
        return ""
    if base_url.rstrip("/") != configured_url.rstrip("/"):
        return ""
    return server_key


def wants_builtin_scripted(request: RolloutRequest, configured_url: str) -> bool:
    return request.model == SCRIPTED and not request.base_url and not configured_url


def resolve_upstream(request: RolloutRequest, settings: Settings) -> Upstream:
    defaults = CATALOG.get(request.endpoint)
    if wants_builtin_scripted(request, defaults.configured(settings)[0] if defaults else ""):
        return Upstream(request.endpoint, builtin_scripted_url(), BUILTIN_KEY, SCRIPTED, disable_thinking=False)
    configured_url = ""
    if defaults is None:
        base_url, api_key, model = request.base_url, request.api_key, request.model
        key_required, thinking_off = False, False
        hint = "pass base_url and model, or endpoint='vllm'|'openai'|'hf_router'"
    else:
        configured_url, configured_key, configured_model = defaults.configured(settings)
        base_url = request.base_url or configured_url
        api_key = request.api_key or _server_key(request, base_url, configured_url, configured_key)
        model = request.model or configured_model
        key_required, thinking_off = defaults.key_required, defaults.thinking_disabled_by_default
        hint = f"pass it, or set {defaults.variables()}"
    missing = [name for name, value in (("base_url", base_url), ("model", model)) if not value]
    if key_required and not api_key:
        missing.append("api_key")
    if missing:
        where = f"endpoint {request.endpoint!r}" if request.endpoint else "a custom endpoint"
        raise EndpointError(f"{', '.join(missing)} missing for {where}: {hint}")
    if not base_url.startswith(("http://", "https://")):
        raise EndpointError(f"base_url must start with http:// or https://, got {base_url[:80]!r}")
    disable_thinking = thinking_off if request.disable_thinking is None else request.disable_thinking
    from_caller = bool(request.base_url) and request.base_url.rstrip("/") != configured_url.rstrip("/")
    key_from_server = bool(api_key) and not request.api_key
    return Upstream(
        request.endpoint, base_url.rstrip("/"), api_key, model, disable_thinking, from_caller, key_from_server
    )
