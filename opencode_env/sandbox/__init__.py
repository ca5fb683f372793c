"""Sandbox backends behind one Protocol (`base.Sandbox`, `base.SandboxBackend`), chosen by name."""

from __future__ import annotations

import os
from typing import Literal

from opencode_env.sandbox.base import SandboxBackend

BackendName = Literal["auto", "local", "e2b"]


def resolve_backend_name(name: BackendName) -> Literal["local", "e2b"]:
    """`auto` is E2B when E2B_API_KEY is set, the local backend otherwise."""
    if name == "auto":
        return "e2b" if os.environ.get("E2B_API_KEY") else "local"
    return name


def make_backend(name: BackendName = "auto") -> SandboxBackend:
    resolved = resolve_backend_name(name)
    if resolved == "local":
        from opencode_env.opencode import cached_tools
        from opencode_env.sandbox.local import LocalBackend

        return LocalBackend(cached_tools)
    from opencode_env.sandbox.e2b import E2BBackend

    return E2BBackend()
