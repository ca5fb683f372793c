"""Installed distributions looked up only in the directories given, whatever sys.path becomes: the graded tests'
runner and the grader's start-up file pin them to the interpreter's own at start-up, so a `*.dist-info` in the work
dir (whose entry points would name pytest plugins, among others) is never one. Both load this file from beside them
by its path; it runs in the image's Python (3.8 or newer)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from importlib import machinery


def pin_distributions(paths: Iterable[str]) -> None:
    """Installed distributions are looked up only in `paths` from now on."""
    allowed = {os.path.abspath(path) for path in paths if path}

    class PinnedPathFinder(machinery.PathFinder):
        @classmethod
        def find_distributions(cls, context=None):  # type: ignore[no-untyped-def]
            from importlib import metadata

            context = context or metadata.DistributionFinder.Context()
            kept = [path for path in context.path if os.path.abspath(path or ".") in allowed]
            pinned = metadata.DistributionFinder.Context(name=context.name, path=kept)
            return metadata.MetadataPathFinder.find_distributions(pinned)

    sys.meta_path[:] = [PinnedPathFinder if finder is machinery.PathFinder else finder for finder in sys.meta_path]
