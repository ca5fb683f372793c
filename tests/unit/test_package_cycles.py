"""No package of ours imports, through any chain, a package that imports it back: the import contracts
(pyproject.toml) name the arrows one by one, and this finds a cycle none of them names. Packages are the folders
of `opencode_env` (and its top-level modules) and `server`; grimp (import-linter's own graph) reads the imports,
those inside functions included."""

from __future__ import annotations

import grimp
import pytest


def package_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("opencode_env")
    packages = {"server", *graph.find_children("opencode_env")}

    def package_of(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    arrows: dict[str, set[str]] = {package: set() for package in packages}
    for module in graph.modules:
        source = package_of(module)
        if source is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            target = package_of(imported)
            if target is not None and target != source:
                arrows[source].add(target)
    return arrows


def strongly_connected(arrows: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's components of more than one package: each is a set of packages that reach one another."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(arrows[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def arrows() -> dict[str, set[str]]:
    return package_graph()


def test_the_cycle_finder_finds_a_cycle_through_three_packages() -> None:
    arrows = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(arrows) == [frozenset({"a", "b", "c"})]


def test_no_package_imports_one_that_imports_it_back(arrows: dict[str, set[str]]) -> None:
    assert [sorted(cycle) for cycle in strongly_connected(arrows)] == []
