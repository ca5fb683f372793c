"""The grader's Python start-up file, which every backend's hand-over writes into the grader's fresh HOME.

Verify runs with PYTHONSAFEPATH, so Python no longer puts the script's directory (or the current one, for `-c` and
`-m`) first on sys.path, where a work dir's `pytest/` or `json.py` would shadow what the grader imports. This file,
found through PYTHONPATH as `sitecustomize`, runs the image's own sitecustomize if it has one (never one in that
directory, nor the current one), then puts that directory back at the END of sys.path (tests still import the
agent's solution from the work dir, which now shadows nothing installed). Installed distributions (whose entry points
name pytest plugins, among others) are from then on looked up only in the directories on sys.path at start-up (the
interpreter's own and its site directories): a `*.dist-info` in the work dir, in any case, or in a directory a test
run adds to sys.path later, is never one. It lives where only the host and the grader can write, made afresh at each
hand-over.
"""

from __future__ import annotations

GRADER_HOME = "/home/grader/home"
"""The grader's HOME in every backend (reset by every hand-over; the agent cannot enter /home/grader)."""
GRADER_PYTHON_DIR = f"{GRADER_HOME}/.opencode-env-python"
"""In the grader's HOME (reset by every hand-over; the agent cannot enter /home/grader)."""
GRADER_PYCACHE_DIR = f"{GRADER_HOME}/.opencode-env-pycache"
"""PYTHONPYCACHEPREFIX: bytecode (and pytest's assertion-rewrite cache) read and written only here."""
SITECUSTOMIZE = "sitecustomize.py"

SITECUSTOMIZE_SOURCE = '''"""opencode-env's grader start-up: the entry directory goes last on sys.path."""
import importlib.machinery
import importlib.util
import os
import sys


def _entry_directory():
    first = sys.argv[0] if sys.argv else ""
    if first in ("", "-c", "-m", "-"):
        return os.getcwd()
    return os.path.dirname(os.path.abspath(first))


def _image_sitecustomize(here, entry):
    skipped = {here, os.path.abspath(entry or ".")}
    others = [path for path in sys.path if path and os.path.abspath(path) not in skipped]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _pin_distributions(paths):
    allowed = {os.path.abspath(path) for path in paths if path}

    class PinnedPathFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_distributions(cls, context=None):
            from importlib import metadata

            context = context or metadata.DistributionFinder.Context()
            kept = [path for path in context.path if os.path.abspath(path or ".") in allowed]
            pinned = metadata.DistributionFinder.Context(name=context.name, path=kept)
            return metadata.MetadataPathFinder.find_distributions(pinned)

    finder = importlib.machinery.PathFinder
    sys.meta_path[:] = [PinnedPathFinder if item is finder else item for item in sys.meta_path]


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    _pin_distributions(sys.path)
    try:
        entry = _entry_directory()
    except OSError:
        entry = None
    _image_sitecustomize(here, entry)
    if entry and entry not in sys.path:
        sys.path.append(entry)


_start()
'''
