"""What the `server` extra adds to the thin client, and the commands that need it: those that run a rollout, a
sandbox or a server in this process. Every other command (`--help`, `view`, `export`, `settings`, `eval --server`)
runs on the client alone."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable

SERVER_EXTRA = "pip install 'opencode-env[server]'"
SERVER_MODULES = frozenset(
    {"fastapi", "uvicorn", "httptools", "orjson", "openenv", "e2b", "huggingface_hub", "fastmcp", "starlette"}
    | {"pyseccomp"}
)
"""What the server extra installs, as imported (uvloop too, where the platform has it): a missing module of another
name is a fault, not a choice of install."""

RunsHere = Callable[[argparse.Namespace], bool]


def always(_: argparse.Namespace) -> bool:
    return True


def missing_server_modules() -> list[str]:
    return sorted(name for name in SERVER_MODULES if importlib.util.find_spec(name) is None)


def server_extra_refusal(command: str, missing: str) -> str:
    return (
        f"opencode-env {command}: this command runs rollouts, sandboxes or a server in this process, which needs the "
        f"server extra (this install has the client only; not installed: {missing}): {SERVER_EXTRA}"
    )


def refusal_for(args: argparse.Namespace) -> str | None:
    """Why `args`' command cannot run on this install (None: it can)."""
    runs_here: RunsHere | None = getattr(args, "runs_here", None)
    if runs_here is None or not runs_here(args):
        return None
    missing = missing_server_modules()
    return server_extra_refusal(args.command, ", ".join(missing)) if missing else None
