"""Every setting an operator gives opencode-env through the environment, in one typed table.

`Settings.load()` reads them once (pydantic-settings): each is validated by type and range, so a bad value is
refused at start with its name, not deep inside a rollout. The README's settings table and `opencode-env settings`
(the effective values, secrets never shown) are both made from this class, and a test checks that no module reads
an operator variable this table does not declare. Variables we set ourselves for our own processes (the proxy's
key and token variables, OpenCode's flags) are not settings and are not here.
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_IMAGE_STORAGE_MB = 50 << 10
"""50 GiB."""

BackendName = Literal["auto", "local", "e2b", "hf"]
"""Where rollouts run: a backend of the sandbox registry, or `auto` (the registry decides)."""
LOWER_CASE_TOO = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY")
"""Read in either case, as curl reads them."""
Group = Literal["server", "endpoints", "local backend", "E2B", "Hugging Face", "network"]


def _setting(default: Any, name: str, group: Group, description: str, **constraints: Any) -> Any:
    return Field(
        default, validation_alias=name, description=description, json_schema_extra={"group": group}, **constraints
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", populate_by_name=False)

    token: SecretStr = _setting(
        SecretStr(""),
        "OPENCODE_ENV_TOKEN",
        "server",
        "The bearer token every caller but /health and /ready must send; unset, only callers on this machine are "
        "served.",
    )
    allow_unauthenticated: bool = _setting(
        False,
        "OPENCODE_ENV_ALLOW_UNAUTHENTICATED",
        "server",
        "1: serve callers beyond this machine without a token (a trusted network only).",
    )
    allowed_hosts: str = _setting(
        "",
        "OPENCODE_ENV_ALLOWED_HOSTS",
        "server",
        "Without a token: host names the server answers to besides localhost, this machine's names and IP addresses.",
    )
    revoked_callers: str = _setting(
        "",
        "OPENCODE_ENV_REVOKED_CALLERS",
        "server",
        "Caller names, comma-separated, whose tokens the server refuses and will not issue again (changing "
        "OPENCODE_ENV_TOKEN withdraws every caller token at once).",
        pattern=r"^[A-Za-z0-9_,\s-]*$",
    )
    mcp_sessions: int = _setting(
        256,
        "OPENCODE_ENV_MCP_SESSIONS",
        "server",
        "Sessions open at once on each session transport: standard MCP (more get 503) and OpenEnv's WebSocket.",
        ge=1,
        le=100_000,
    )
    mcp_sessions_per_caller: int = _setting(
        32,
        "OPENCODE_ENV_MCP_SESSIONS_PER_CALLER",
        "server",
        "Sessions one caller token may hold open at once, standard MCP and WebSocket together (more are refused; the "
        "operator's are not counted).",
        ge=1,
        le=100_000,
    )
    rollouts_per_caller: int = _setting(
        0,
        "OPENCODE_ENV_ROLLOUTS_PER_CALLER",
        "server",
        "Rollout slots one caller token may hold at once (0: all of them). Whatever it is, a freed slot goes to the "
        "waiting caller holding the fewest.",
        ge=0,
        le=100_000,
    )
    queued_per_caller: int = _setting(
        256,
        "OPENCODE_ENV_QUEUED_PER_CALLER",
        "server",
        "Rollout calls one caller token may have waiting for a slot, every transport together (more are refused at "
        "once; the operator's are not counted).",
        ge=1,
        le=100_000,
    )
    max_body_mb: int = _setting(
        64,
        "OPENCODE_ENV_MAX_BODY_MB",
        "server",
        "Largest request body on any route, MiB, counted as it streams in (larger get 413 before any parsing).",
        ge=1,
        le=4096,
    )
    body_mb_per_caller: int = _setting(
        128,
        "OPENCODE_ENV_BODY_MB_PER_CALLER",
        "server",
        "Request bodies one caller token may have in the server at once, MiB, until each request is answered (more "
        "get 429; the operator's are not counted).",
        ge=1,
        le=65536,
    )
    mcp_session_idle_s: float = _setting(
        600.0,
        "OPENCODE_ENV_MCP_SESSION_IDLE_S",
        "server",
        "Seconds an MCP session with no request in flight is kept (a call in flight keeps it).",
        gt=0,
        le=86400,
    )
    backend: BackendName = _setting(
        "auto", "OPENCODE_ENV_BACKEND", "server", "Where rollouts run (auto: e2b with E2B_API_KEY, hf on a Space)."
    )
    max_concurrent_envs: int | None = _setting(
        None, "MAX_CONCURRENT_ENVS", "server", "Rollouts at once over every transport (default: the backend's).", ge=1
    )
    host: str = _setting("0.0.0.0", "HOST", "server", "The address `python -m opencode_env.server.app` listens on.")
    port: int = _setting(8000, "PORT", "server", "The port the server listens on (never a model URL).", ge=1, le=65535)
    results_dir: str = _setting(
        "", "OPENCODE_ENV_RESULTS_DIR", "server", "Where finished results are kept (default ~/.local/state/...)."
    )
    results_keep: int = _setting(
        200,
        "OPENCODE_ENV_RESULTS_KEEP",
        "server",
        "Results kept there per caller (0: memory only); a rollout that never got a sandbox is not kept there.",
        ge=0,
        le=100_000,
    )
    result_retention_s: float = _setting(
        3600.0,
        "OPENCODE_ENV_RESULT_RETENTION_S",
        "server",
        "Seconds a finished result stays readable by reference (the tool's answer links to it).",
        gt=0,
        le=365 * 86400,
    )
    web_results: int = _setting(
        20, "OPENCODE_ENV_WEB_RESULTS", "server", "Rollouts the /web form runs at once per caller.", ge=1, le=10_000
    )
    upstream_allow: str = _setting(
        "",
        "OPENCODE_ENV_UPSTREAM_ALLOW",
        "server",
        "Hosts, host:port pairs or networks a caller's base_url may name beyond public addresses.",
    )
    max_memory_mb: int = _setting(16384, "OPENCODE_ENV_MAX_MEMORY_MB", "server", "Largest memory_mb a request asks.")
    max_processes: int = _setting(4096, "OPENCODE_ENV_MAX_PROCESSES", "server", "Largest max_processes a request asks.")
    max_disk_mb: int = _setting(32768, "OPENCODE_ENV_MAX_DISK_MB", "server", "Largest disk_mb a request asks.")
    max_cpus: float = _setting(8, "OPENCODE_ENV_MAX_CPUS", "server", "Largest cpus a request asks.")
    vllm_url: str = _setting("", "VLLM_URL", "endpoints", "endpoint='vllm': the base URL.")
    vllm_api_key: SecretStr = _setting(SecretStr(""), "VLLM_API_KEY", "endpoints", "endpoint='vllm': its key.")
    vllm_model: str = _setting("", "VLLM_MODEL", "endpoints", "endpoint='vllm': the model.")
    openai_base_url: str = _setting("", "OPENAI_BASE_URL", "endpoints", "endpoint='openai' (default OpenAI's).")
    openai_api_key: SecretStr = _setting(SecretStr(""), "OPENAI_API_KEY", "endpoints", "endpoint='openai': its key.")
    openai_model: str = _setting("", "OPENAI_MODEL", "endpoints", "endpoint='openai': the model.")
    hf_router_base_url: str = _setting("", "HF_ROUTER_BASE_URL", "endpoints", "endpoint='hf_router' (default HF's).")
    hf_router_api_key: SecretStr = _setting(
        SecretStr(""), "HF_ROUTER_API_KEY", "endpoints", "endpoint='hf_router': its key."
    )
    hf_router_model: str = _setting("", "HF_ROUTER_MODEL", "endpoints", "endpoint='hf_router': the model.")
    policy_version_header: str = _setting(
        "",
        "OPENCODE_ENV_POLICY_VERSION_HEADER",
        "endpoints",
        "A response header in which the model server reports the policy (weights) version of each call; the capture "
        "proxy records it per turn.",
        max_length=128,
        pattern=r"^[A-Za-z0-9-]*$",
    )
    https_proxy: str = _setting("", "HTTPS_PROXY", "network", "The operator's proxy for https model URLs.")
    http_proxy: str = _setting("", "HTTP_PROXY", "network", "The operator's proxy for http model URLs.")
    no_proxy: str = _setting("", "NO_PROXY", "network", "Hosts reached without that proxy.")
    egress_trusted_hosts: str = _setting(
        "",
        "OPENCODE_ENV_EGRESS_TRUSTED_HOSTS",
        "network",
        "Names the sandbox's egress proxy lets through even when they resolve to private addresses (mirrors).",
    )
    local_image: str = _setting(
        "", "OPENCODE_ENV_LOCAL_IMAGE", "local backend", "The default image ('host': the host's own system)."
    )
    image_archive_dir: str = _setting(
        "",
        "OPENCODE_ENV_IMAGE_ARCHIVE_DIR",
        "local backend",
        "The only directory whose files a request may name as an image archive (oci-archive:/docker-archive:); "
        "unset: archives are refused.",
    )
    memory_overcommit: float = _setting(
        4.0,
        "OPENCODE_ENV_MEMORY_OVERCOMMIT",
        "local backend",
        "Rollouts' memory limits may add up to this many times the machine's memory.",
        gt=0,
    )
    cache: str = _setting("", "OPENCODE_ENV_CACHE", "local backend", "Our caches (default ~/.cache/opencode-env).")
    image_storage_mb: int = _setting(
        DEFAULT_IMAGE_STORAGE_MB,
        "OPENCODE_ENV_IMAGE_STORAGE_MB",
        "local backend",
        "What task images leave on this machine, together: the task images we build (in podman's storage) and the "
        "unpacked image cache. Past it the least recently used not in use are evicted; an image that does not fit "
        "fails its task.",
        ge=1,
    )
    e2b_api_key: SecretStr = _setting(SecretStr(""), "E2B_API_KEY", "E2B", "Rollouts in E2B sandboxes.")
    e2b_max_sandboxes: int = _setting(20, "OPENCODE_ENV_E2B_MAX_SANDBOXES", "E2B", "E2B sandboxes alive at once.", ge=1)
    hf_token: SecretStr = _setting(SecretStr(""), "HF_TOKEN", "Hugging Face", "A token allowed to run Jobs.")
    space_id: str = _setting("", "SPACE_ID", "Hugging Face", "Set by a Space: auto picks Hugging Face Sandboxes.")
    space_host: str = _setting(
        "", "SPACE_HOST", "Hugging Face", "Set by a Space: its host name, which a server without a token answers to."
    )
    hf_sandboxes: bool = _setting(
        False, "OPENCODE_ENV_HF_SANDBOXES", "Hugging Face", "1: auto picks Hugging Face Sandboxes with HF_TOKEN."
    )
    hf_image: str = _setting("", "OPENCODE_ENV_HF_IMAGE", "Hugging Face", "The sandboxes' default image.")
    hf_flavor: str = _setting("cpu-basic", "OPENCODE_ENV_HF_FLAVOR", "Hugging Face", "The Jobs hardware flavor.")
    hf_namespace: str = _setting("", "OPENCODE_ENV_HF_NAMESPACE", "Hugging Face", "Whose Jobs (default the token's).")
    hf_max_sandboxes: int = _setting(
        20, "OPENCODE_ENV_HF_MAX_SANDBOXES", "Hugging Face", "Hugging Face sandboxes alive at once.", ge=1
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what `load` passes: it is the one place that reads an environment, and a test's mapping is the
        whole environment it describes."""
        return (init_settings,)

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings from `environ` (default: this process's environment), validated."""
        values = dict(os.environ if environ is None else environ)
        for name in LOWER_CASE_TOO:
            if name not in values and name.lower() in values:
                values[name] = values[name.lower()]
        return cls.model_validate({name: values[name] for name in variable_names() if name in values})


OURS_FOR_OUR_PROCESSES = frozenset(
    {
        "OPENCODE_ENV_UPSTREAM_KEY",
        "OPENCODE_ENV_PROXY_TOKEN",
        "OPENCODE_ENV_TOOLS_BIN",
        "OPENCODE_ENV_TEMPLATE_FORMAT",
        "OPENCODE_ENV_HTTPS_PROXY",
        "OPENCODE_ENV_HTTP_PROXY",
        "OPENCODE_ENV_NO_PROXY",
    }
)
"""Variables we set for processes we start (the proxy's key and token, markers in our own images), not settings."""
OURS_FOR_TESTS = frozenset(
    {"OPENCODE_ENV_LIVE_ENDPOINT", "OPENCODE_ENV_TEST_ARTIFACTS", "OPENCODE_ENV_LOCAL_ISOLATION"}
)
"""Variables the test suite reads (a live endpoint, where browser screenshots go), not settings."""
PREFIX = "OPENCODE_ENV_"


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each OPENCODE_ENV_* variable in `environ` that nothing reads, with the closest known name (None: no close
    one): a misspelled setting is otherwise silently ignored."""
    known = {name for name in variable_names() if name.startswith(PREFIX)}
    quiet = known | OURS_FOR_OUR_PROCESSES | OURS_FOR_TESTS
    unknown = sorted(name for name in environ if name.startswith(PREFIX) and name not in quiet)
    # Compared without the prefix every name shares, which would make any two names look alike.
    suffixes = sorted(name.removeprefix(PREFIX) for name in known)
    return [(name, _closest(name.removeprefix(PREFIX), suffixes)) for name in unknown]


def _closest(suffix: str, suffixes: list[str]) -> str | None:
    matches = difflib.get_close_matches(suffix, suffixes, n=1, cutoff=0.6)
    return PREFIX + matches[0] if matches else None


def unknown_variable_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per unknown OPENCODE_ENV_* variable of `environ` (default: this process's), naming the closest."""
    lines = []
    for name, closest in unknown_variables(os.environ if environ is None else environ):
        hint = f"did you mean {closest}?" if closest else "`opencode-env settings` lists every setting"
        lines.append(f"{name} is not a setting and is ignored ({hint})")
    return lines


def variable_names() -> list[str]:
    return [str(field.validation_alias) for field in Settings.model_fields.values()]


def variable(setting: str) -> str:
    """The environment variable that sets `setting` (a field of Settings)."""
    return str(Settings.model_fields[setting].validation_alias)


def _group(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    return str(extra.get("group", "")) if isinstance(extra, dict) else ""


def _shown_default(field: FieldInfo) -> str:
    default = field.default
    if isinstance(default, SecretStr) or default in ("", None):
        return ""
    if isinstance(default, bool):
        return "1" if default else "0"
    return str(default)


def markdown_table() -> str:
    """The README's settings table."""
    lines = ["| variable | group | default | meaning |", "|---|---|---|---|"]
    for field in Settings.model_fields.values():
        default = _shown_default(field)
        lines.append(
            f"| `{field.validation_alias}` | {_group(field)} | {f'`{default}`' if default else ''} | "
            f"{field.description} |"
        )
    return "\n".join(lines)


def effective(settings: Settings, environ: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(variable, value as shown, where it came from) for each setting; a secret shows only whether it is set."""
    values = os.environ if environ is None else environ
    rows = []
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            shown = "(set, hidden)" if value.get_secret_value() else "(not set)"
        else:
            shown = "" if value is None else str(value)
        variable = str(field.validation_alias)
        rows.append((variable, shown, "environment" if variable in values else "default"))
    return rows


@functools.cache
def warn_unknown_variables() -> None:
    """Once per process, at its start: each OPENCODE_ENV_* variable that is no setting, with the closest name."""
    for line in unknown_variable_warnings():
        print(f"opencode-env: warning: {line}", file=sys.stderr)


def settings_or_exit() -> Settings:
    """The operator's settings, loaded once by the command (or server) that needs them; a refused one ends the process
    with its name. Unknown OPENCODE_ENV_* variables are warned about the first time."""
    warn_unknown_variables()
    try:
        return Settings.load()
    except ValidationError as error:
        print(f"opencode-env: a setting is refused: {error}", file=sys.stderr)
        raise SystemExit(2) from error
