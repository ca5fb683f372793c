"""`opencode-env eval --ray ADDRESS`: an eval over the simulated cluster writes the same directory (results, summary,
index) as on one machine, and a rerun resumes it, running only what is missing. Its own module: the eval's driver
needs every node's slots, which the other module's driver holds while that module runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from opencode_env.cli import main
from opencode_env.evals.runner import EvalConfig
from opencode_env.evals.summary import EvalSummary
from tests.cluster.conftest import oracle


def test_an_eval_on_the_cluster_resumes_where_it_stopped(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([oracle(name).model_dump(mode="json") for name in ("first", "second")]))
    out = tmp_path / "eval"
    argv = ["eval", str(tasks), "--out", str(out), "-k", "2", "--oracle", "--ray", cluster.address]

    assert main(argv) == 0
    summary = EvalSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.overall.infrastructure_failures == {}
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("results/*/*.json")) == [
        "results/first/1.json",
        "results/first/2.json",
        "results/second/1.json",
        "results/second/2.json",
    ]
    assert EvalConfig.model_validate_json((out / "eval.json").read_text()).runs_on.startswith("ray cluster")
    kept = (out / "results/first/1.json").read_text()

    (out / "results/second/2.json").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    assert "3 done already (skipped), 1 to run" in capsys.readouterr().err
    assert (out / "results/second/2.json").exists()
    assert (out / "results/first/1.json").read_text() == kept
    assert (out / "index.html").exists()
