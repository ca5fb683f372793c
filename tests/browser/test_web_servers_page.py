"""/web in a real headless Chromium when several servers share one results directory: each row says which server
ran it (this one, or an earlier one at this address), the page says which server it is and what of the directory it
does not list (other servers' rows, by address); a long task id is cut with an ellipsis inside its cell (the whole
id in its title), its box clear of the next cell's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.result_store import ResultsDir
from opencode_env.server.runs import Run, Runs, ServerOrigin
from opencode_env.testing.chromium import chromium, save_screenshot
from opencode_env.viewer.rows import OPERATOR
from opencode_env.viewer.web import web_router
from opencode_env.wire import RolloutRequest, RolloutResult

pytestmark = pytest.mark.timeout(180)
HERE, ELSEWHERE = "127.0.0.1:8001", "127.0.0.1:8002"
LONG_TASK = "swe-smith/" + "x" * 60 + "-" + "0123abcd" * 8

ROW_BOXES = """
const box = (e) => {
  const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom};
};
const rows = [...document.querySelectorAll('#runs tbody tr')];
const row = rows.find((r) => r.querySelector('.run-task').title === arguments[0]);
const task = row.querySelector('.run-task');
return {task: box(task), server: box(row.querySelector('.run-server')), table: box(document.getElementById('runs')),
        panel: box(document.getElementById('runs').closest('.web-panel')), text: task.textContent, title: task.title,
        overflow: getComputedStyle(task).textOverflow};
"""


async def _finish(runs: Runs, task_id: str) -> None:
    run = runs.begin(RolloutRequest(instruction="go", task_id=task_id))
    await runs.finish(run, RolloutResult(task_id=task_id, reward=1.0, reward_source="reward_txt"))


@pytest.fixture
def web_url(tmp_path: Path) -> Iterator[tuple[str, Runs]]:
    async def earlier_rows() -> None:
        await _finish(Runs(results=ResultsDir(tmp_path), origin=ServerOrigin.this_process(HERE)), "before-restart")
        await _finish(Runs(results=ResultsDir(tmp_path), origin=ServerOrigin.this_process(ELSEWHERE)), "theirs")

    asyncio.run(earlier_rows())
    runs = Runs(results=ResultsDir(tmp_path), origin=ServerOrigin.this_process(HERE))
    asyncio.run(_finish(runs, LONG_TASK))

    async def never(request: RolloutRequest, run: Run) -> RolloutResult:
        raise AssertionError("nothing is started from this page")

    app = FastAPI()
    app.include_router(web_router(runs, lambda request, caller: runs.start(request, never, caller), lambda _: OPERATOR))
    server = ThreadedServer(app)
    server.start()
    yield server.url, runs
    server.stop()


def test_each_row_names_its_server_and_the_others_are_counted(web_url: tuple[str, Runs]) -> None:
    url, runs = web_url
    with chromium() as browser:
        browser.set_window_size(1100, 900)
        browser.get(f"{url}/web")
        WebDriverWait(browser, 30).until(
            lambda b: len(b.find_elements(By.CSS_SELECTOR, "#runs tbody tr .run-server")) == 2
        )
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "others-note").text)
        cells = {
            row.find_element(By.CLASS_NAME, "run-task").get_attribute("title"): row.find_element(
                By.CLASS_NAME, "run-server"
            )
            for row in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
        }
        boxes = browser.execute_script(ROW_BOXES, LONG_TASK)
        save_screenshot(browser, "web-servers.png")
        assert set(cells) == {LONG_TASK, "before-restart"}
        assert cells[LONG_TASK].text == "this server"
        assert "this-server" in cells[LONG_TASK].get_attribute("class").split()
        earlier = next(view for view in runs.views() if view.task_id == "before-restart")
        assert earlier.server is not None
        assert cells["before-restart"].text == f"earlier server here (pid {earlier.server.pid})"
        assert HERE in cells["before-restart"].get_attribute("title")
        this_server = browser.find_element(By.ID, "this-server").text
        assert this_server.startswith(f"This server: {HERE} (pid {runs.origin.pid}, started ")
        note = browser.find_element(By.ID, "others-note").text
        assert f"Not listed: 1 rollout(s) of other servers sharing its results directory ({ELSEWHERE}: 1)" in note
        assert "theirs" not in browser.find_element(By.ID, "runs").text
    assert boxes["title"] == LONG_TASK
    assert boxes["overflow"] == "ellipsis"
    assert boxes["task"]["right"] <= boxes["server"]["left"]
    assert boxes["table"]["right"] <= boxes["panel"]["right"]
