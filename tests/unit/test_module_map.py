"""The module map (docs/module-map.md) names every module of the package in its own folder's entry: a module added,
moved or renamed without a line in the map fails here, so the next maintainer's map is the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+/)(?= |$)")
TOP_FILE = re.compile(r"^(?P<indent> {2})(?P<name>\w+\.py)(?= )")
MODULE = re.compile(r"(?<![\w/])(\w+\.py)\b")
CONTINUATION = 18
"""Lines indented this far continue the entry above them."""


def mapped_modules(text: str) -> set[tuple[str, str]]:
    """(folder, module) pairs the map's tree names: the folder is the path of nested folder entries above."""
    tree = text.split("```")[3]
    stack: list[tuple[int, str]] = []
    pairs: set[tuple[str, str]] = set()
    for raw in tree.splitlines():
        line = raw
        indent = len(line) - len(line.lstrip(" "))
        folder = FOLDER.match(line)
        if folder and indent < CONTINUATION:
            stack = [(depth, name) for depth, name in stack if depth < indent]
            stack.append((indent, folder["name"].rstrip("/")))
            line = line[folder.end() :]
        elif TOP_FILE.match(line):
            stack = [(depth, name) for depth, name in stack if depth < indent]
        where = "/".join(name for _, name in stack)
        pairs.update((where, module) for module in MODULE.findall(line))
    return pairs


def package_modules() -> set[tuple[str, str]]:
    found = set()
    for base in ("opencode_env", "server"):
        for path in (ROOT / base).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if relative.name in ("__init__.py", "__main__.py") or relative.parts[:2] == ("opencode_env", "server"):
                continue
            found.add(("/".join(relative.parts[:-1]), relative.name))
    return found


def test_every_module_is_on_the_map() -> None:
    mapped = mapped_modules((ROOT / "docs" / "module-map.md").read_text(encoding="utf-8"))
    missing = sorted(f"{folder}/{name}" for folder, name in package_modules() - mapped)
    assert not missing, f"docs/module-map.md does not name these modules in their folder's entry: {missing}"


def test_the_map_names_no_module_that_is_gone() -> None:
    mapped = mapped_modules((ROOT / "docs" / "module-map.md").read_text(encoding="utf-8"))
    gone = sorted(
        f"{folder}/{name}" for folder, name in mapped - package_modules() if folder.startswith(("opencode", "server"))
    )
    assert not gone, f"docs/module-map.md names modules the tree does not hold: {gone}"
