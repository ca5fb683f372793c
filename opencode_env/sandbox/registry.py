"""Every sandbox backend by name, and what the rest of the package may ask about one without naming it: how to
build it, how many rollouts it runs at once by default, what it needs from the environment and whether that is
there, whether it enforces a rollout's resource limits, and how to reap what it left behind.

Code outside `sandbox/` asks here and never compares a backend's name; a name the registry does not know is
refused with the known ones, never taken for another backend.

Backends read no environment: the registry builds each one from a `Settings` (the operator's settings, loaded once
by whoever starts: the server, the command line), and a caller that passes none gets `Settings.load()`.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from opencode_env.sandbox.base import SandboxBackend
from opencode_env.settings import Settings

AUTO = "auto"
EMBEDDED = "local"
"""The backend that runs on this machine with nothing to configure: used when a caller names none."""
HF_OPT_IN_VAR = "OPENCODE_ENV_HF_SANDBOXES"
E2B_CONCURRENCY = 16
"""Below OPENCODE_ENV_E2B_MAX_SANDBOXES's default of 20 (E2B's free-tier cap)."""

Reaper = Callable[[Settings, float], Awaitable[list[str]]]
"""Kills the sandboxes a backend tagged (with the credentials in the settings) that have lived longer than the given
seconds; returns their ids."""


@runtime_checkable
class Preflighted(Protocol):
    """A backend that has checked, once, whether it can run a rollout here (None: it can)."""

    def preflight_problem(self) -> str | None: ...


@runtime_checkable
class RunsPreflight(Protocol):
    """A backend that can check itself once at start (the local one runs its exact isolation once)."""

    async def preflight(self) -> str | None: ...


@dataclass(frozen=True)
class BackendSpec:
    name: str
    needs: str
    """What it needs from the environment, said to an operator."""
    build: Callable[[Settings], SandboxBackend]
    default_concurrency: Callable[[], int]
    """Rollouts at once when MAX_CONCURRENT_ENVS does not say."""
    environment_problem: Callable[[Settings], str | None]
    """A cheap check of what it needs in the settings (no sandbox started): what is missing and what to set, or
    None."""
    enforces_limits: bool
    """Whether it enforces a rollout's memory, process, disk and CPU limits (else its VM's size bounds a rollout)."""
    proxy_beside_task_root: bool = True
    """Whether the capture proxy, which holds the model key, runs on the machine where the task's root runs (a cloud
    VM): root there could read the key, so a key from the server's environment must not meet a caller's root."""
    risk: str = "runs rollouts"
    """What it does for whoever reaches a server on it, said to an operator who left the server open."""
    reap: Reaper | None = None
    """None when it leaves nothing to reap by hand (the local backend reaps its leftovers at its first sandbox)."""


class UnknownBackend(ValueError):
    """A backend name the registry does not know; the message names it, where it came from and the known ones."""

    def __init__(self, name: str, *, named_by: str = "") -> None:
        self.name = name
        known = ", ".join([AUTO, *BACKENDS])
        source = f"{named_by} names " if named_by else ""
        super().__init__(f"{source}an unknown sandbox backend {name!r}: the known ones are {known}")


def per_cpu_concurrency() -> int:
    """Two rollouts per CPU of this machine (at least two)."""
    return max(2, (os.cpu_count() or 2) * 2)


def _loaded(settings: Settings | None) -> Settings:
    """`settings`, else this process's environment's."""
    return settings if settings is not None else Settings.load()


def _build_local(settings: Settings) -> SandboxBackend:
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.egress import parse_trusted_hosts
    from opencode_env.sandbox.local.tools import cache_root, cached_tools

    cache = cache_root(settings.cache)
    return LocalBackend(
        functools.partial(cached_tools, cache),
        image=settings.local_image,
        memory_overcommit=settings.memory_overcommit,
        egress_trusted_hosts=parse_trusted_hosts(settings.egress_trusted_hosts),
        cache_dir=cache,
        image_archive_dir=Path(settings.image_archive_dir) if settings.image_archive_dir else None,
    )


def _build_e2b(settings: Settings) -> SandboxBackend:
    from opencode_env.sandbox.cloud.e2b import E2BBackend

    return E2BBackend(api_key=settings.e2b_api_key.get_secret_value(), max_sandboxes=settings.e2b_max_sandboxes)


def _build_hf(settings: Settings) -> SandboxBackend:
    from opencode_env.sandbox.cloud.hf import HFBackend, default_image

    return HFBackend(
        token=settings.hf_token.get_secret_value(),
        image=default_image(settings.hf_image, settings.space_id),
        flavor=settings.hf_flavor,
        namespace=settings.hf_namespace,
        max_sandboxes=settings.hf_max_sandboxes,
    )


def _local_problem(settings: Settings) -> str | None:
    from opencode_env.sandbox.local.backend import INSTALL_HINT, ROOT_HINT

    if shutil.which("bwrap") is None:
        return INSTALL_HINT
    return ROOT_HINT if os.geteuid() != 0 else None


def _e2b_problem(settings: Settings) -> str | None:
    if settings.e2b_api_key.get_secret_value():
        return None
    return "the e2b backend needs an E2B API key: set E2B_API_KEY"


def _hf_problem(settings: Settings) -> str | None:
    from huggingface_hub import get_token

    # Beside HF_TOKEN, the SDK's own login (`hf auth login`) is a token the backend uses.
    if settings.hf_token.get_secret_value() or get_token():
        return None
    return "the hf backend needs a Hugging Face token with Jobs access: set HF_TOKEN"


async def _reap_e2b(settings: Settings, older_than_s: float) -> list[str]:
    from opencode_env.sandbox.cloud.e2b import reap

    return await reap(older_than_s=older_than_s, api_key=settings.e2b_api_key.get_secret_value())


async def _reap_hf(settings: Settings, older_than_s: float) -> list[str]:
    from opencode_env.sandbox.cloud.hf import reap

    return await reap(
        older_than_s=older_than_s, token=settings.hf_token.get_secret_value(), namespace=settings.hf_namespace
    )


BACKENDS: Mapping[str, BackendSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            BackendSpec(
                name="local",
                needs="bubblewrap, and root, on this machine",
                build=_build_local,
                default_concurrency=per_cpu_concurrency,
                environment_problem=_local_problem,
                enforces_limits=True,
                proxy_beside_task_root=False,
                risk="runs commands on this machine",
            ),
            BackendSpec(
                name="e2b",
                needs="E2B_API_KEY",
                build=_build_e2b,
                default_concurrency=lambda: E2B_CONCURRENCY,
                environment_problem=_e2b_problem,
                enforces_limits=False,
                risk="starts sandboxes billed to the server owner's E2B account",
                reap=_reap_e2b,
            ),
            BackendSpec(
                name="hf",
                needs="HF_TOKEN (a Hugging Face token with Jobs access)",
                build=_build_hf,
                default_concurrency=per_cpu_concurrency,
                environment_problem=_hf_problem,
                enforces_limits=False,
                risk="starts sandboxes billed to the server owner's Hugging Face account",
                reap=_reap_hf,
            ),
        )
    }
)
AUTO_RULE = f"auto: e2b when E2B_API_KEY is set, else hf on a Space or with HF_TOKEN and {HF_OPT_IN_VAR}=1, else local"


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def reapable_names() -> tuple[str, ...]:
    return tuple(name for name, spec in BACKENDS.items() if spec.reap is not None)


def backend_spec(name: str) -> BackendSpec:
    if name not in BACKENDS:
        raise UnknownBackend(name)
    return BACKENDS[name]


def resolve_backend_name(name: str, settings: Settings) -> str:
    """`auto` is E2B when E2B_API_KEY is set; else Hugging Face Sandboxes on a Space (SPACE_ID) or with HF_TOKEN and
    OPENCODE_ENV_HF_SANDBOXES=1 (an HF token alone is common and must not start billing); else the local backend.
    Any other name must be a registered one (UnknownBackend)."""
    if name != AUTO:
        return backend_spec(name).name
    if settings.e2b_api_key.get_secret_value():
        return "e2b"
    if settings.space_id or (settings.hf_token.get_secret_value() and settings.hf_sandboxes):
        return "hf"
    return EMBEDDED


def make_backend(name: str = AUTO, settings: Settings | None = None) -> SandboxBackend:
    """The backend `name` names, built from `settings` (default: this process's environment's)."""
    settings = _loaded(settings)
    return backend_spec(resolve_backend_name(name, settings)).build(settings)


def default_backend(settings: Settings | None = None) -> SandboxBackend:
    return make_backend(EMBEDDED, settings)


def default_concurrency(backend: SandboxBackend) -> int:
    """The backend's own default; a backend outside the registry (a test double) gets the per-CPU one."""
    spec = BACKENDS.get(backend.name)
    return spec.default_concurrency() if spec is not None else per_cpu_concurrency()


def backend_risk(backend: SandboxBackend) -> str:
    """See BackendSpec.risk; a backend outside the registry runs rollouts, as far as anyone can say."""
    spec = BACKENDS.get(backend.name)
    return spec.risk if spec is not None else BackendSpec.risk


def proxy_beside_task_root(backend: SandboxBackend) -> bool:
    """See BackendSpec.proxy_beside_task_root; a backend outside the registry (a test double) is taken to share."""
    spec = BACKENDS.get(backend.name)
    return spec.proxy_beside_task_root if spec is not None else True


def backend_problem(backend: object, name: str, settings: Settings | None = None) -> str | None:
    """What stops this backend (registered as `name`) from running rollouts: its own preflight verdict when it has
    one, else the cheap check of what it needs in `settings` (default: this process's environment's); None when
    nothing is known wrong."""
    if isinstance(backend, Preflighted):
        return backend.preflight_problem()
    spec = BACKENDS.get(name)
    return spec.environment_problem(_loaded(settings)) if spec is not None else None


async def reap_sandboxes(name: str, *, older_than_s: float, settings: Settings | None = None) -> list[str]:
    """Kill the sandboxes backend `name` tagged that outlived `older_than_s`, with the credentials in `settings`
    (default: this process's environment's); returns their ids."""
    reap = backend_spec(name).reap
    if reap is None:
        raise ValueError(f"the {name} backend leaves nothing to reap; these do: {', '.join(reapable_names())}")
    return await reap(_loaded(settings), older_than_s)
