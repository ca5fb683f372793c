"""`opencode-env view RESULT.json [--out PAGE.html] [--open]`: write the viewer page for a saved result."""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.viewer.page import render_page
from opencode_env.wire.models import RolloutResult


def _cmd_view(args: argparse.Namespace) -> int:
    source: Path = args.result
    try:
        result = RolloutResult.model_validate_json(source.read_bytes())
    except OSError as error:
        print(f"opencode-env view: cannot read {source}: {error.strerror}", file=sys.stderr)
        return 2
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        print(f"opencode-env view: {source} is not a RolloutResult: {where}: {first['msg']}", file=sys.stderr)
        return 2
    out: Path = args.out or source.with_suffix(".html")
    out.write_text(render_page(result), encoding="utf-8")
    print(out)
    if args.open:
        webbrowser.open(out.resolve().as_uri())
    return 0


def add_view_parser(subparsers: Any) -> None:
    """Register `view` on the CLI's subparsers (argparse's private _SubParsersAction, hence Any)."""
    view = subparsers.add_parser("view", help="write a self-contained HTML page for a RolloutResult JSON file")
    view.add_argument("result", type=Path, metavar="RESULT.json")
    view.add_argument("--out", type=Path, default=None, metavar="PAGE.html", help="default: RESULT.html")
    view.add_argument("--open", action="store_true", help="open the page in the default browser")
    view.set_defaults(handler=_cmd_view)
