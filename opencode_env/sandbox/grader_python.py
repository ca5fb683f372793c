"""The grader's Python start-up file, which every backend's hand-over writes into the grader's fresh HOME.

Verify runs with PYTHONSAFEPATH, so Python no longer puts the script's directory (or the current one, for `-c` and
`-m`) first on sys.path, where a work dir's `pytest/` or `json.py` would shadow what the grader imports. This file,
found through PYTHONPATH as `sitecustomize`, runs the image's own sitecustomize if it has one (never one in that
directory, nor the current one), then puts that directory back at the END of sys.path (tests still import the
agent's solution from the work dir, which now shadows nothing installed). It lives where only the host and the
grader can write, made afresh at each hand-over.
"""

from __future__ import annotations

GRADER_PYTHON_DIR = "/home/grader/home/.opencode-env-python"
"""In the grader's HOME (reset by every hand-over; the agent cannot enter /home/grader)."""
GRADER_PYCACHE_DIR = "/home/grader/home/.opencode-env-pycache"
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


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        entry = _entry_directory()
    except OSError:
        entry = None
    _image_sitecustomize(here, entry)
    if entry and entry not in sys.path:
        sys.path.append(entry)


_start()
'''
