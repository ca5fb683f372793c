"""No package of ours imports, through any chain, a package that imports it back: the import contracts
(pyproject.toml) name the arrows one by one, and this finds a cycle none of them names. Packages are the folders
of `opencode_env` (the server among them) and its top-level modules; grimp (import-linter's own graph) reads the
imports, those inside functions included, and test_import_graph's cycle finder reads the graph of packages."""

from __future__ import annotations

import grimp
import pytest

from tests.unit.test_import_graph import cycles


def package_graph(graph: grimp.ImportGraph, packages: set[str]) -> grimp.ImportGraph:
    """`graph` folded into one node per package: an arrow wherever a module of one imports a module of another."""

    def package_of(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    folded = grimp.ImportGraph()
    for package in packages:
        folded.add_module(package)
    for module in graph.modules:
        source = package_of(module)
        for imported in graph.find_modules_directly_imported_by(module):
            target = package_of(imported)
            if source is not None and target is not None and target != source:
                folded.add_import(importer=source, imported=target)
    return folded


@pytest.fixture(scope="module")
def packages() -> grimp.ImportGraph:
    graph = grimp.build_graph("opencode_env")
    return package_graph(graph, set(graph.find_children("opencode_env")))


def test_the_cycle_finder_finds_a_cycle_through_three_packages() -> None:
    modules = grimp.ImportGraph()
    for name in ("a", "b", "c", "d", "a.x", "b.y", "c.z", "d.w"):
        modules.add_module(name)
    for importer, imported in (("a.x", "b.y"), ("b.y", "c.z"), ("c.z", "a.x"), ("d.w", "a.x")):
        modules.add_import(importer=importer, imported=imported)
    assert cycles(package_graph(modules, {"a", "b", "c", "d"})) == [["a", "b", "c"]]


def test_no_package_imports_one_that_imports_it_back(packages: grimp.ImportGraph) -> None:
    assert cycles(packages) == []
