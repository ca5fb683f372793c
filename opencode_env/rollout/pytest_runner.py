"""The graded tests' pytest, started as `python3 -I pytest_runner.py --tests DIR --workdir DIR -- PYTEST_ARGS`.

The host writes this file into the sandbox beside the graded tests (outside the work dir) and runs it with the image's
own Python as the grader. Isolated mode (`-I`) already ignores every PYTHON* variable, the user site and the script's
and current directory; this file then builds the rest of the run from its own arguments, before any file of the
agent's can be imported:
- pytest, its built-in plugins and the image's plugins are imported from the image while the work dir is not on
  sys.path at all, with the image's own bytecode; from then on Python reads and writes no bytecode (a fresh, empty
  pycache prefix, writing off), so nothing compiled by the agent is ever loaded, pytest's rewrite cache included;
- plugins come only from the image: autoload is off, and each `pytest11` entry point of a distribution on the
  interpreter's own path (its site directories) is named with `-p`; every later look-up of installed distributions
  searches those directories only, never the work dir nor a directory a test run adds;
- sys.path is [the tests' directory, its parent, the interpreter's own path..., the work dir]: a module of the agent's
  named like a graded test or a file the task handed over never wins, nor one named like anything installed; a
  directory of the work dir the image's `.pth` files put on the path (a task's editable install) stays, after the
  image's, but is neither searched while pytest is imported nor for installed distributions;
- PYTEST_ADDOPTS and PYTEST_PLUGINS are dropped; the rest of the command line is the host's.
It runs in the image's Python (3.8 or newer), so it uses nothing newer and imports nothing of opencode_env.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from typing import Any

DROPPED_VARIABLES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def image_plugins() -> list[str]:
    """The modules of every `pytest11` entry point installed where this interpreter looks at start-up."""
    from importlib import metadata

    points: Any = metadata.entry_points()
    group = points.select(group="pytest11") if hasattr(points, "select") else points.get("pytest11", ())
    return sorted({point.value.split(":", 1)[0].strip() for point in group})


def pin_distributions(paths: list[str]) -> None:
    """Installed distributions are looked up only in `paths` from now on, whatever sys.path becomes."""
    from importlib import machinery, metadata

    allowed = {os.path.abspath(path) for path in paths if path}

    class PinnedPathFinder(machinery.PathFinder):
        @classmethod
        def find_distributions(cls, context=None):  # type: ignore[no-untyped-def]
            context = context or metadata.DistributionFinder.Context()
            kept = [path for path in context.path if os.path.abspath(path or ".") in allowed]
            pinned = metadata.DistributionFinder.Context(name=context.name, path=kept)
            return metadata.MetadataPathFinder.find_distributions(pinned)

    sys.meta_path[:] = [PinnedPathFinder if finder is machinery.PathFinder else finder for finder in sys.meta_path]


def import_pytest() -> object:
    """pytest and its built-in plugins, from the image, with the image's bytecode."""
    pytest = importlib.import_module("pytest")
    config = importlib.import_module("_pytest.config")
    for name in getattr(config, "default_plugins", ()):
        importlib.import_module(f"_pytest.{name}")
    return pytest


def inside(path: str, directory: str) -> bool:
    """`path` is `directory` or under it (a task's editable install can put the work dir's `src` on the path)."""
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def parse(argv: list[str]) -> tuple[str, str, list[str]]:
    """(tests, workdir, pytest's arguments) from `--tests DIR --workdir DIR -- ARGS...`."""
    split = argv.index("--")
    options, rest = argv[:split], argv[split + 1 :]
    named = {options[index]: options[index + 1] for index in range(0, len(options) - 1, 2)}
    return named["--tests"], named["--workdir"], rest


def main(argv: list[str]) -> int:
    tests, workdir, arguments = parse(argv)
    for name in DROPPED_VARIABLES:
        os.environ.pop(name, None)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.dont_write_bytecode = True
    startup = [path for path in sys.path if path]
    image = [path for path in startup if not inside(path, workdir)]
    agents = [path for path in startup if inside(path, workdir)]
    sys.path[:] = image
    pytest = import_pytest()
    pin_distributions(image)
    plugins = image_plugins()
    for plugin in plugins:
        importlib.import_module(plugin)
    sys.pycache_prefix = tempfile.mkdtemp(prefix="opencode-env-pycache-")
    sys.path[:] = [tests, os.path.dirname(tests), *image, *agents, workdir]
    for plugin in plugins:
        arguments = ["-p", plugin, *arguments]
    return int(pytest.main(arguments))  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
