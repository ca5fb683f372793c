"""Sandbox backends behind one Protocol (`base.Sandbox`, `base.SandboxBackend`), chosen by name in `registry`."""

from __future__ import annotations

from opencode_env.sandbox.base import Capabilities, Preflight
from opencode_env.sandbox.registry import (
    AUTO,
    AUTO_RULE,
    BACKENDS,
    EMBEDDED,
    BackendFactory,
    UnknownBackend,
    backend_factory,
    backend_names,
    default_backend,
    make_backend,
    reap_sandboxes,
    reapable_names,
    resolve_backend_name,
)
from opencode_env.settings import BackendName

__all__ = [
    "AUTO",
    "AUTO_RULE",
    "BACKENDS",
    "EMBEDDED",
    "BackendFactory",
    "BackendName",
    "Capabilities",
    "Preflight",
    "UnknownBackend",
    "backend_factory",
    "backend_names",
    "default_backend",
    "make_backend",
    "reap_sandboxes",
    "reapable_names",
    "resolve_backend_name",
]
