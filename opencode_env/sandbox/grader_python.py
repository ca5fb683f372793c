"""Where the grader's Python files go: its start-up file (inside/sitecustomize.py, found through PYTHONPATH) and the
finder it loads from beside it, written by every backend's hand-over into the grader's fresh HOME, where only the host
and the grader can write."""

from __future__ import annotations

from opencode_env.inside import PINNED_FINDER, source

GRADER_HOME = "/home/grader/home"
"""The grader's HOME in every backend (reset by every hand-over; the agent cannot enter /home/grader)."""
GRADER_PYTHON_DIR = f"{GRADER_HOME}/.opencode-env-python"
"""In the grader's HOME (reset by every hand-over; the agent cannot enter /home/grader)."""
GRADER_PYCACHE_DIR = f"{GRADER_HOME}/.opencode-env-pycache"
"""PYTHONPYCACHEPREFIX: bytecode (and pytest's assertion-rewrite cache) read and written only here."""
SITECUSTOMIZE = "sitecustomize.py"
GRADER_PYTHON_FILES = {name: source(name) for name in (SITECUSTOMIZE, PINNED_FINDER)}
"""What the hand-over writes into GRADER_PYTHON_DIR: the start-up file and the finder it loads from beside it."""
