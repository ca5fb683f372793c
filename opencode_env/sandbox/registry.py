"""Every sandbox backend by name: how to build it from the operator's settings, what it needs (said to an operator
before one is built), and how to reap what it left behind. What a built backend can do (`capabilities`) and whether
it can run here (`preflight`) it says itself (base.SandboxBackend); nothing here looks a backend up by its name to
find them.

A name the registry does not know is refused with the known ones, never taken for another backend.

Backends read no environment: the registry builds each one from a `Settings` (the operator's settings, loaded once
by whoever starts: the server, the command line), and a caller that passes none gets `Settings.load()`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from opencode_env.sandbox.base import SandboxBackend
from opencode_env.settings import Settings, variable

AUTO = "auto"
EMBEDDED = "local"
"""The backend that runs on this machine with nothing to configure: used when a caller names none."""

Reaper = Callable[[Settings, float], Awaitable[list[str]]]
"""Kills the sandboxes a backend tagged (with the credentials in the settings) that have lived longer than the given
seconds; returns their ids."""


@dataclass(frozen=True)
class BackendFactory:
    name: str
    needs: str
    """What it needs from the environment, said to an operator."""
    build: Callable[[Settings], SandboxBackend]
    reap: Reaper | None = None
    """None when it leaves nothing to reap by hand (the local backend reaps its leftovers at its first sandbox)."""


class UnknownBackend(ValueError):
    """A backend name the registry does not know; the message names it, where it came from and the known ones."""

    def __init__(self, name: str, *, named_by: str = "") -> None:
        self.name = name
        known = ", ".join([AUTO, *BACKENDS])
        source = f"{named_by} names " if named_by else ""
        super().__init__(f"{source}an unknown sandbox backend {name!r}: the known ones are {known}")


def _loaded(settings: Settings | None) -> Settings:
    """`settings`, else this process's environment's."""
    return settings if settings is not None else Settings.load()


def _build_local(settings: Settings) -> SandboxBackend:
    from opencode_env.sandbox.local.backend import LocalBackend
    from opencode_env.sandbox.local.isolation.egress import parse_trusted_hosts
    from opencode_env.sandbox.local.tools import cache_root, cached_tools

    cache = cache_root(settings.cache)
    return LocalBackend(
        functools.partial(cached_tools, cache),
        image=settings.local_image,
        memory_overcommit=settings.memory_overcommit,
        egress_trusted_hosts=parse_trusted_hosts(settings.egress_trusted_hosts),
        cache_dir=cache,
        image_archive_dir=Path(settings.image_archive_dir) if settings.image_archive_dir else None,
        image_storage_bytes=settings.image_storage_mb << 20,
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


async def _reap_e2b(settings: Settings, older_than_s: float) -> list[str]:
    from opencode_env.sandbox.cloud.e2b import reap

    return await reap(older_than_s=older_than_s, api_key=settings.e2b_api_key.get_secret_value())


async def _reap_hf(settings: Settings, older_than_s: float) -> list[str]:
    from opencode_env.sandbox.cloud.hf import reap

    return await reap(
        older_than_s=older_than_s, token=settings.hf_token.get_secret_value(), namespace=settings.hf_namespace
    )


BACKENDS: Mapping[str, BackendFactory] = MappingProxyType(
    {
        factory.name: factory
        for factory in (
            BackendFactory(name="local", needs="bubblewrap, and root, on this machine", build=_build_local),
            BackendFactory(name="e2b", needs="E2B_API_KEY", build=_build_e2b, reap=_reap_e2b),
            BackendFactory(
                name="hf", needs="HF_TOKEN (a Hugging Face token with Jobs access)", build=_build_hf, reap=_reap_hf
            ),
        )
    }
)
AUTO_RULE = (
    f"auto: e2b when E2B_API_KEY is set, else hf on a Space or with HF_TOKEN and {variable('hf_sandboxes')}=1, "
    "else local"
)


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def reapable_names() -> tuple[str, ...]:
    return tuple(name for name, factory in BACKENDS.items() if factory.reap is not None)


def backend_factory(name: str) -> BackendFactory:
    if name not in BACKENDS:
        raise UnknownBackend(name)
    return BACKENDS[name]


def resolve_backend_name(name: str, settings: Settings) -> str:
    """`auto` is E2B when E2B_API_KEY is set; else Hugging Face Sandboxes on a Space (SPACE_ID) or with HF_TOKEN and
    OPENCODE_ENV_HF_SANDBOXES=1 (an HF token alone is common and must not start billing); else the local backend.
    Any other name must be a registered one (UnknownBackend)."""
    if name != AUTO:
        return backend_factory(name).name
    if settings.e2b_api_key.get_secret_value():
        return "e2b"
    if settings.space_id or (settings.hf_token.get_secret_value() and settings.hf_sandboxes):
        return "hf"
    return EMBEDDED


def make_backend(name: str = AUTO, settings: Settings | None = None) -> SandboxBackend:
    """The backend `name` names, built from `settings` (default: this process's environment's)."""
    settings = _loaded(settings)
    return backend_factory(resolve_backend_name(name, settings)).build(settings)


def default_backend(settings: Settings | None = None) -> SandboxBackend:
    return make_backend(EMBEDDED, settings)


async def reap_sandboxes(name: str, *, older_than_s: float, settings: Settings | None = None) -> list[str]:
    """Kill the sandboxes backend `name` tagged that outlived `older_than_s`, with the credentials in `settings`
    (default: this process's environment's); returns their ids."""
    reap = backend_factory(name).reap
    if reap is None:
        raise ValueError(f"the {name} backend leaves nothing to reap; these do: {', '.join(reapable_names())}")
    return await reap(_loaded(settings), older_than_s)
