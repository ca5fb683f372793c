"""`opencode-env` (and `python -m opencode_env`): the command line, or, where only the thin client is installed,
which extra to install for it."""

from __future__ import annotations

import sys

SERVER_EXTRA = "pip install 'opencode-env[server]'"
SERVER_MODULES = frozenset(
    {"fastapi", "uvicorn", "uvloop", "httptools", "orjson", "openenv", "e2b", "huggingface_hub", "fastmcp"}
    | {"starlette", "pyseccomp"}
)
"""What the server extra installs, as imported: another missing module is a fault, not a choice of install."""


def main() -> int:
    try:
        from opencode_env.cli.app import main as command_line
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        print(
            f"opencode-env: the command line runs rollouts, which needs the server extra ({missing.name} is not "
            f"installed; this install has the client only): {SERVER_EXTRA}",
            file=sys.stderr,
        )
        return 2
    return command_line()


if __name__ == "__main__":
    sys.exit(main())
