"""The audit's index.html in a real headless Chromium: the matrix with the worst task first, every played cell a link
to its evidence, and no network."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from opencode_env.audit.page import render_page
from opencode_env.audit.records import AuditReport, Check, PlayInfo, Record, TaskAudit
from opencode_env.testing.chromium import chromium, network_requests

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as session:
        yield session


def task(task_id: str, native: str, ours: str) -> TaskAudit:
    checks = [
        Check(layout=layout, verdict="ok", reason="fine", oracle_reward=1.0, nothing_reward=0.0,
              oracle_file=f"results/{task_id}/oracle.{layout}.json", nothing_file="")
        for layout in ("native", "ours")
    ]  # fmt: skip
    records = [
        Record(task_id=task_id, play="tests-edit", family="visible tests", layout="native", outcome=native,  # type: ignore[arg-type]
               why="w", result_file=f"results/{task_id}/tests-edit.native.json"),
        Record(task_id=task_id, play="tests-edit", family="visible tests", layout="ours", outcome=ours,  # type: ignore[arg-type]
               why="w", result_file=f"results/{task_id}/tests-edit.ours.json" if ours != "not_played" else ""),
    ]  # fmt: skip
    return TaskAudit(task_id=task_id, kind="request", checks=checks, records=records, suggestions=["tests-edit: fix"])


def test_the_matrix_puts_the_worst_task_first_and_each_cell_opens_its_evidence(
    browser: WebDriver, tmp_path: Path
) -> None:
    report = AuditReport(
        where="backend local",
        plays=[PlayInfo(name="tests-edit", family="visible tests", tries="t", proves="p", fix="f", source="builtin")],
        tasks=[task("a-clean", "blocked", "not_played"), task("z-leaky", "admitted", "admitted")],
    )
    for audit in report.tasks:
        folder = tmp_path / "results" / audit.task_id
        folder.mkdir(parents=True)
        for record in audit.records:
            if record.result_file:
                (tmp_path / record.result_file).write_text(f'{{"evidence": "{record.task_id} {record.layout}"}}')
    page = tmp_path / "index.html"
    page.write_text(render_page(report))
    browser.get(page.as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "main > table:first-of-type tbody tr")
    assert [row.find_element(By.CSS_SELECTOR, "td.name").text.splitlines()[0] for row in rows] == ["z-leaky", "a-clean"]
    admitted = browser.find_elements(By.CSS_SELECTOR, "a.cell.admitted")
    assert [cell.text for cell in admitted] == ["A", "A"]
    assert browser.find_elements(By.CSS_SELECTOR, "a.cell.blocked")[0].text == "B"
    admitted[1].click()
    assert browser.current_url.endswith("results/z-leaky/tests-edit.ours.json")
    assert "z-leaky ours" in browser.page_source
    assert network_requests(browser) == []
