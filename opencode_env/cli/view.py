"""`opencode-env view RESULT.json|DIR [--out PAGE.html] [--open]`: write the viewer page of a saved result, or of
every attempt in an eval's output dir (each page beside its result)."""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path
from typing import Any

from opencode_env.cli.result_files import ResultFileError, read_result, result_files
from opencode_env.viewer.page import render_page


def _cmd_view(args: argparse.Namespace) -> int:
    source: Path = args.result
    try:
        found = result_files(source)
        if args.out is not None and (len(found) != 1 or source.is_dir()):
            raise ResultFileError("--out names one page: give it with one RESULT.json, not a directory")
        pages = []
        for item in found:
            out: Path = args.out or item.path.with_suffix(".html")
            out.write_text(render_page(read_result(item.path)), encoding="utf-8")
            pages.append(out)
    except ResultFileError as error:
        print(f"opencode-env view: {error}", file=sys.stderr)
        return 2
    for page in pages:
        print(page)
    if args.open:
        index = source / "index.html"
        webbrowser.open((index if index.is_file() else pages[0]).resolve().as_uri())
    return 0


def add_view_parser(subparsers: Any) -> None:
    """Register `view` on the CLI's subparsers (argparse's private _SubParsersAction, hence Any)."""
    view = subparsers.add_parser(
        "view", help="write a self-contained HTML page for a RolloutResult JSON file (or each of an eval dir's)"
    )
    view.add_argument(
        "result", type=Path, metavar="RESULT_OR_DIR", help="a RolloutResult JSON file or an eval's output dir"
    )
    view.add_argument("--out", type=Path, default=None, metavar="PAGE.html", help="default: RESULT.html")
    view.add_argument("--open", action="store_true", help="open the page (an eval's index.html) in the browser")
    view.set_defaults(handler=_cmd_view)
