"""Ray stays an optional extra: only `opencode_env.cluster` imports it (grimp's graph, which counts imports inside
functions and for type checking too), and neither the package nor its CLI loads it when the cluster is not used."""

from __future__ import annotations

import subprocess
import sys

import grimp

CLUSTER = "opencode_env.cluster"


def test_only_the_cluster_package_imports_ray() -> None:
    graph = grimp.build_graph("opencode_env", include_external_packages=True)
    importers = graph.find_modules_that_directly_import("ray")
    assert importers, "the cluster package imports ray: the check must see it"
    outside = sorted(module for module in importers if module != CLUSTER and not module.startswith(f"{CLUSTER}."))
    assert outside == []


def test_the_package_and_its_cli_load_no_ray() -> None:
    probe = (
        "import sys, opencode_env, opencode_env.cli, opencode_env.evals.runner, opencode_env.server.app; "
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
