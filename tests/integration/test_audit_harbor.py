"""A Harbor task audited in its native layout (one box, test.sh as root, our hardening unset) beside ours: the
shipped example's test.sh reads pytest's exit status, so a module that exits 0 on import passes it in both."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.audit.driver import Audit
from opencode_env.audit.inputs import load_audit_inputs
from opencode_env.audit.plays import panel
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox.local.backend import LocalBackend

pytestmark = pytest.mark.timeout(1200)

TASK = Path(__file__).resolve().parents[2] / "examples" / "harbor" / "fix-calc"


async def test_a_harbor_task_is_audited_natively_as_harbor_grades_it(
    backend: LocalBackend, tmp_path: Path, no_leaks: None
) -> None:
    loaded = load_audit_inputs([TASK])
    (task,) = loaded.tasks
    assert task.kind == "harbor"
    assert task.oracle.solution == ["bash /solution/solve.sh"]
    assert task.request.solution is None
    report = await Audit(InProcess(backend), panel(only=["exit-zero-import"]), tmp_path).run(loaded.tasks)
    (audited,) = report.tasks
    assert [(check.layout, check.verdict) for check in audited.checks] == [("native", "ok"), ("ours", "ok")]
    native = audited.records[0]
    assert (native.layout, native.outcome) == ("native", "admitted")
    assert "prefixed ./calc.py" in native.log
    assert "/bin/bash -c 'bash /tests/test.sh'" in native.log
