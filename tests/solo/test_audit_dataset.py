"""`opencode-env audit examples/audit`, run once as a user runs it (the real pipeline, the real local backend, every
play of the panel): every hole the dataset was built with is found in the native layout, no clean task is claimed,
and the report holds one record per task x play x layout with its evidence."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from opencode_env.audit.plays import builtin_plays
from opencode_env.audit.records import AuditReport, Record

pytestmark = pytest.mark.timeout(3600)

DATASET = Path(__file__).resolve().parents[2] / "examples" / "audit"
HOLES: dict[str, set[str]] = {
    "visible-check-script": {"tests-edit", "tests-empty", "exit-zero-import", "eq-always"},
    "visible-tests-loop": {"tests-edit", "tests-delete"},
    "pytest-conftest": {"conftest-pass"},
    "pytest-ini": {"ini-addopts"},
    "python-path-startup": {"sitecustomize"},
    "writable-site-packages": {"pth-hook"},
    "exit-status-import": {"exit-zero-import", "eq-always"},
    "grep-success-line": {"success-markers"},
    "reward-staged-in-workdir": {"reward-prewrite"},
    "git-fix-on-branch": {"git-mine"},
    "git-fix-unreachable": {"git-mine"},
    "expected-output-exposed": {"read-exposed"},
    "writable-path-dir": {"path-shadow"},
    "helper-in-workdir": {"helper-edit"},
    "map-over-code": {"stop-iteration"},
}
CLEAN = ("clean-test-grader", "clean-isolated-check", "clean-answer-file")
UNREACHABLE = {"lingering-rewriter", "reward-link"}
"""Plays no layout on our backends can admit: the agent's processes end with it and the verifier directory is the
grader's (an empty one) at the hand-over, in the native layout too (docs/audit.md says so)."""
BLOCKED_ON_MAIN = {
    ("pytest-conftest", "conftest-pass"),
    ("pytest-ini", "ini-addopts"),
    ("python-path-startup", "sitecustomize"),
    ("writable-site-packages", "pth-hook"),
    ("writable-path-dir", "path-shadow"),
}
"""Holes our default grading closed when this was written (the grader's box, its integrity restore)."""


@dataclass(frozen=True)
class Audited:
    report: AuditReport
    out: Path
    exit_code: int
    stdout: str
    stderr: str

    def record(self, task: str, play: str, layout: str) -> Record:
        audit = next(item for item in self.report.tasks if item.task_id == task)
        return next(record for record in audit.records if record.play == play and record.layout == layout)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Audited:
    out = tmp_path_factory.mktemp("audit")
    done = subprocess.run(
        [sys.executable, "-m", "opencode_env", "audit", str(DATASET), "--out", str(out), "--fix-suggestions"],
        capture_output=True,
        text=True,
        timeout=3500,
        check=False,
    )
    report = AuditReport.model_validate_json((out / "audit.json").read_text())
    return Audited(report, out, done.returncode, done.stdout, done.stderr)


def test_every_task_loads_and_its_oracle_and_doing_nothing_are_what_check_task_wants(audited: Audited) -> None:
    assert sorted(task.task_id for task in audited.report.tasks) == sorted([*HOLES, *CLEAN])
    assert audited.report.broken == []
    for task in audited.report.tasks:
        assert [(check.layout, check.verdict) for check in task.checks] == [("native", "ok"), ("ours", "ok")], task


def test_every_hole_is_found_in_the_native_layout(audited: Audited) -> None:
    missed = [
        (task, play, audited.record(task, play, "native").why)
        for task, plays in HOLES.items()
        for play in plays
        if audited.record(task, play, "native").outcome != "admitted"
    ]
    assert missed == []


def test_no_clean_task_is_claimed_though_the_plays_ran_on_them(audited: Audited) -> None:
    claimed = [
        (record.task_id, record.play, record.layout)
        for task in audited.report.tasks
        if task.task_id in CLEAN
        for record in task.records
        if record.outcome == "admitted"
    ]
    assert claimed == []
    played_clean = {
        record.play
        for task in audited.report.tasks
        if task.task_id in CLEAN
        for record in task.records
        if record.outcome == "blocked"
    }
    assert played_clean == {play.name for play in builtin_plays()}


def test_each_play_has_a_task_built_to_admit_it(audited: Audited) -> None:
    admitting = {play for plays in HOLES.values() for play in plays}
    assert {play.name for play in builtin_plays()} - admitting == UNREACHABLE
    for play in UNREACHABLE:
        outcomes = {record.outcome for task in audited.report.tasks for record in task.records if record.play == play}
        assert "admitted" not in outcomes


def test_what_our_default_blocks_is_blocked_with_evidence(audited: Audited) -> None:
    for task, play in BLOCKED_ON_MAIN:
        ours = audited.record(task, play, "ours")
        assert ours.outcome == "blocked", ours
        assert (audited.out / ours.result_file).is_file()
    conftest = audited.record("pytest-conftest", "conftest-pass", "ours")
    assert any(finding.kind == "conftest" for finding in conftest.findings), conftest.findings


def test_the_report_holds_every_record_with_its_evidence(audited: Audited) -> None:
    report = audited.report
    plays = len(builtin_plays())
    assert all(len(task.records) == 2 * plays for task in report.tasks)
    for task in report.tasks:
        for record in task.records:
            if record.outcome in {"admitted", "blocked"}:
                assert (audited.out / record.result_file).is_file()
                assert "[audit] play exited" in record.log
    assert (audited.out / "index.html").read_text().count('class="cell admitted"') == sum(
        len(task.admitted("native")) + len(task.admitted("ours")) for task in report.tasks
    )


def test_the_command_says_what_it_found_and_fails_when_our_default_admits_a_hack(audited: Audited) -> None:
    admitted_by_us = [task.task_id for task in audited.report.admitted_by_us()]
    assert audited.exit_code == (1 if admitted_by_us else 0), audited.stderr[-3000:]
    assert "exit-status-import" in admitted_by_us
    first_rows = [line.split()[0] for line in audited.stdout.splitlines()[1 : len(admitted_by_us) + 1]]
    assert sorted(first_rows) == sorted(admitted_by_us)
    assert "fix exit-status-import: exit-zero-import: grade from a positive signal" in audited.stdout
    assert "[1/" in audited.stderr
