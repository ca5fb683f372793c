"""Code that runs inside a sandbox as files of its own: the standard library only, nothing else of ours (a contract
says so; tests/integration/test_inside.py runs each file under `python3 -I -S` alone), shipped beside the proxy or by a
grader's hand-over and run by the image's Python (3.8 or newer). Our code ships them by `source(name)`."""

from __future__ import annotations

from pathlib import Path

PINNED_FINDER = "pinned_finder.py"
"""Shipped beside each file that loads it (the runner, the start-up file), under this name."""


def source(name: str) -> str:
    """The text of this package's file `name`, as it is shipped."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")
