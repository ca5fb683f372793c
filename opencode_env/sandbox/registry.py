"""Every sandbox backend by name, and what the rest of the package may ask about one without naming it: how to
build it, how many rollouts it runs at once by default, what it needs from the environment and whether that is
there, whether it enforces a rollout's resource limits, and how to reap what it left behind.

Code outside `sandbox/` asks here and never compares a backend's name; a name the registry does not know is
refused with the known ones, never taken for another backend.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Protocol, runtime_checkable

from opencode_env.sandbox.base import SandboxBackend

BackendName = Literal["auto", "local", "e2b", "hf"]
AUTO = "auto"
EMBEDDED = "local"
"""The backend that runs on this machine with nothing to configure: used when a caller names none."""
HF_OPT_IN_VAR = "OPENCODE_ENV_HF_SANDBOXES"
E2B_CONCURRENCY = 16
"""Below OPENCODE_ENV_E2B_MAX_SANDBOXES's default of 20 (E2B's free-tier cap)."""

Reaper = Callable[[float], Awaitable[list[str]]]
"""Kills the sandboxes a backend tagged that have lived longer than the given seconds; returns their ids."""


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
    build: Callable[[], SandboxBackend]
    default_concurrency: Callable[[], int]
    """Rollouts at once when MAX_CONCURRENT_ENVS does not say."""
    environment_problem: Callable[[], str | None]
    """A cheap check of what it needs (no sandbox started): what is missing and what to set, or None."""
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


def _build_local() -> SandboxBackend:
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.tools import cached_tools

    return LocalBackend(cached_tools)


def _build_e2b() -> SandboxBackend:
    from opencode_env.sandbox.cloud.e2b import E2BBackend

    return E2BBackend()


def _build_hf() -> SandboxBackend:
    from opencode_env.sandbox.cloud.hf import HFBackend

    return HFBackend()


def _local_problem() -> str | None:
    from opencode_env.sandbox.local.backend import INSTALL_HINT, ROOT_HINT

    if shutil.which("bwrap") is None:
        return INSTALL_HINT
    return ROOT_HINT if os.geteuid() != 0 else None


def _e2b_problem() -> str | None:
    return None if os.environ.get("E2B_API_KEY") else "the e2b backend needs an E2B API key: set E2B_API_KEY"


def _hf_problem() -> str | None:
    from huggingface_hub import get_token

    if get_token():
        return None
    return "the hf backend needs a Hugging Face token with Jobs access: set HF_TOKEN"


async def _reap_e2b(older_than_s: float) -> list[str]:
    from opencode_env.sandbox.cloud.e2b import reap

    return await reap(older_than_s=older_than_s)


async def _reap_hf(older_than_s: float) -> list[str]:
    from opencode_env.sandbox.cloud.hf import reap

    return await reap(older_than_s=older_than_s)


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


def resolve_backend_name(name: str) -> str:
    """`auto` is E2B when E2B_API_KEY is set; else Hugging Face Sandboxes on a Space (SPACE_ID) or with HF_TOKEN and
    OPENCODE_ENV_HF_SANDBOXES=1 (an HF token alone is common and must not start billing); else the local backend.
    Any other name must be a registered one (UnknownBackend)."""
    if name != AUTO:
        return backend_spec(name).name
    if os.environ.get("E2B_API_KEY"):
        return "e2b"
    if os.environ.get("SPACE_ID") or (os.environ.get("HF_TOKEN") and os.environ.get(HF_OPT_IN_VAR) == "1"):
        return "hf"
    return EMBEDDED


def make_backend(name: str = AUTO) -> SandboxBackend:
    return backend_spec(resolve_backend_name(name)).build()


def default_backend() -> SandboxBackend:
    return make_backend(EMBEDDED)


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


def backend_problem(backend: object, name: str) -> str | None:
    """What stops this backend (registered as `name`) from running rollouts: its own preflight verdict when it has
    one, else the cheap check of what it needs from the environment; None when nothing is known wrong."""
    if isinstance(backend, Preflighted):
        return backend.preflight_problem()
    spec = BACKENDS.get(name)
    return spec.environment_problem() if spec is not None else None


async def reap_sandboxes(name: str, *, older_than_s: float) -> list[str]:
    """Kill the sandboxes backend `name` tagged that outlived `older_than_s`; returns their ids."""
    reap = backend_spec(name).reap
    if reap is None:
        raise ValueError(f"the {name} backend leaves nothing to reap; these do: {', '.join(reapable_names())}")
    return await reap(older_than_s)
