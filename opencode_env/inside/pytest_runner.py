"""The graded tests' pytest, started as `python3 -I pytest_runner.py --tests DIR --workdir DIR -- PYTEST_ARGS` in
the image's own Python (3.8 or newer) as the grader. It builds the run from its own arguments before any file of the
agent's can be imported: pytest and plugins from the image only, no bytecode read or written, the tests' directory
ahead of the work dir on sys.path, by value (`--by-value`) no work dir on it at all. Imports nothing of
opencode_env; docs/grading.md says why each step."""

from __future__ import annotations

import importlib
import os
import runpy
import shutil
import sys
import tempfile
from typing import Any

DROPPED_VARIABLES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
PINNED_FINDER = "pinned_finder.py"
"""Shipped beside this file and run by its path (never looked up on sys.path, which graded code can shadow)."""


def image_plugins() -> list[str]:
    """The modules of every `pytest11` entry point installed where this interpreter looks at start-up."""
    from importlib import metadata

    points: Any = metadata.entry_points()
    group = points.select(group="pytest11") if hasattr(points, "select") else points.get("pytest11", ())
    return sorted({point.value.split(":", 1)[0].strip() for point in group})


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


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the runner's options, pytest's arguments) from `--tests DIR --workdir DIR [...] -- ARGS...`."""
    split = argv.index("--")
    options, rest = argv[:split], argv[split + 1 :]
    return {options[index]: options[index + 1] for index in range(0, len(options) - 1, 2)}, rest


def install_by_value(named: dict[str, str]) -> None:
    """The work dir's modules as stand-ins for the code under test's process (by_value_client.py)."""
    root = named["--by-value-root"]
    sys.path.insert(0, root)
    try:
        client: Any = importlib.import_module("opencode_env.inside.by_value_client")
    finally:
        sys.path.remove(root)
    timeout = float(named["--call-timeout"])
    client.install(
        named["--by-value"], named["--workdir"], call_timeout_s=timeout, connect_timeout_s=max(timeout, 60.0)
    )


def main(argv: list[str]) -> int:
    named, arguments = parse(argv)
    tests, workdir = named["--tests"], named["--workdir"]
    for name in DROPPED_VARIABLES:
        os.environ.pop(name, None)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.dont_write_bytecode = True
    startup = [path for path in sys.path if path]
    image = [path for path in startup if not inside(path, workdir)]
    agents = [path for path in startup if inside(path, workdir)]
    sys.path[:] = image
    pytest = import_pytest()
    finder = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), PINNED_FINDER))
    finder["pin_distributions"](image)
    plugins = image_plugins()
    for plugin in plugins:
        importlib.import_module(plugin)
    empty_pycache = sys.pycache_prefix = tempfile.mkdtemp(prefix="opencode-env-pycache-")
    if "--by-value" in named:
        install_by_value(named)
        sys.path[:] = [tests, os.path.dirname(tests), *image]
    else:
        sys.path[:] = [tests, os.path.dirname(tests), *image, *agents, workdir]
    for plugin in plugins:
        arguments = ["-p", plugin, *arguments]
    try:
        return int(pytest.main(arguments))  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(empty_pycache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
