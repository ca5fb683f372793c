"""The grader's Python start-up file: every backend's hand-over writes it, with pinned_finder.py beside it, into the
grader's fresh HOME (sandbox/grader_python.py), found through PYTHONPATH as `sitecustomize`.

Verify runs with PYTHONSAFEPATH, so the entry directory (the script's, or the current one for `-c` and `-m`) is not
first on sys.path, where a work dir's `pytest/` or `json.py` would shadow what the grader imports. This file pins
installed distributions to the start-up path, runs the image's own sitecustomize if it has one (never one in the
entry directory or here), then puts the entry directory back at the END of sys.path (tests still import the agent's
solution, which now shadows nothing installed). It runs in the image's Python (3.8 or newer)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

PINNED_FINDER = "pinned_finder.py"
"""Shipped beside this file and run by its path (never looked up on sys.path, which graded code can shadow)."""


def _entry_directory() -> str:
    first = sys.argv[0] if sys.argv else ""
    if first in ("", "-c", "-m", "-"):
        return os.getcwd()
    return os.path.dirname(os.path.abspath(first))


def _image_sitecustomize(here: str, entry: str | None) -> None:
    skipped = {here, os.path.abspath(entry or ".")}
    others = [path for path in sys.path if path and os.path.abspath(path) not in skipped]
    _run(importlib.machinery.PathFinder.find_spec("sitecustomize", others))


def _run(spec: importlib.machinery.ModuleSpec | None) -> ModuleType | None:
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    finder = _run(importlib.util.spec_from_file_location("opencode_env_finder", os.path.join(here, PINNED_FINDER)))
    if finder is None:
        raise ImportError(f"{PINNED_FINDER} is missing beside {__file__}")
    finder.pin_distributions(sys.path)
    entry: str | None
    try:
        entry = _entry_directory()
    except OSError:
        entry = None
    _image_sitecustomize(here, entry)
    if entry and entry not in sys.path:
        sys.path.append(entry)


if __name__ == "sitecustomize":
    _start()
