"""`opencode-env` (and `python -m opencode_env`): the command line. Where only the thin client is installed, the
commands that need no sandbox run (every `--help`, `view`, `export`, `settings`, ...) and the others say which extra
to install."""

from __future__ import annotations

import sys

from opencode_env.cli.extras import SERVER_MODULES, server_extra_refusal


def main() -> int:
    try:
        from opencode_env.cli.app import main as command_line

        return command_line()
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] not in SERVER_MODULES | {"uvloop"}:
            raise
        command = next((word for word in sys.argv[1:] if not word.startswith("-")), "")
        print(server_extra_refusal(command, missing.name or ""), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
