"""Sandbox backends behind one Protocol (`base.Sandbox`, `base.SandboxBackend`), chosen by name in `registry`."""

from __future__ import annotations

from opencode_env.sandbox.registry import (
    AUTO,
    AUTO_RULE,
    BACKENDS,
    EMBEDDED,
    HF_OPT_IN_VAR,
    BackendSpec,
    Preflighted,
    RunsPreflight,
    UnknownBackend,
    backend_names,
    backend_problem,
    backend_risk,
    backend_spec,
    default_backend,
    default_concurrency,
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
    "HF_OPT_IN_VAR",
    "BackendName",
    "BackendSpec",
    "Preflighted",
    "RunsPreflight",
    "UnknownBackend",
    "backend_names",
    "backend_problem",
    "backend_risk",
    "backend_spec",
    "default_backend",
    "default_concurrency",
    "make_backend",
    "reap_sandboxes",
    "reapable_names",
    "resolve_backend_name",
]
