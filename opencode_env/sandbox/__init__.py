"""Sandbox backends behind one Protocol (`base.Sandbox`, `base.SandboxBackend`), chosen by name."""

from __future__ import annotations

import os
from typing import Literal

from opencode_env.sandbox.base import SandboxBackend

BackendName = Literal["auto", "local", "e2b", "hf"]
HF_OPT_IN_VAR = "OPENCODE_ENV_HF_SANDBOXES"


def resolve_backend_name(name: BackendName) -> Literal["local", "e2b", "hf"]:
    """`auto` is E2B when E2B_API_KEY is set; else Hugging Face Sandboxes on a Space (SPACE_ID) or with HF_TOKEN and
    OPENCODE_ENV_HF_SANDBOXES=1 (an HF token alone is common and must not start billing); else the local backend."""
    if name != "auto":
        return name
    if os.environ.get("E2B_API_KEY"):
        return "e2b"
    if os.environ.get("SPACE_ID") or (os.environ.get("HF_TOKEN") and os.environ.get(HF_OPT_IN_VAR) == "1"):
        return "hf"
    return "local"


def make_backend(name: BackendName = "auto") -> SandboxBackend:
    resolved = resolve_backend_name(name)
    if resolved == "local":
        from opencode_env.sandbox.local import LocalBackend
        from opencode_env.sandbox.local_tools import cached_tools

        return LocalBackend(cached_tools)
    if resolved == "hf":
        from opencode_env.sandbox.hf import HFBackend

        return HFBackend()
    from opencode_env.sandbox.e2b import E2BBackend

    return E2BBackend()
