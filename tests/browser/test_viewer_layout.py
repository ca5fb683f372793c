"""Long values stay in their own column, in a real headless Chromium: a long image tag (a registry, a path and a
64-hex tag, with no place to break) on the rollout page's task table wraps inside its cell, the whole value also in
the cell's title. The honest form: the value's cell box does not intersect the next column's box
(getBoundingClientRect), and the text is not wider than its cell."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from opencode_env.testing.chromium import chromium, save_screenshot
from opencode_env.viewer import render_page
from opencode_env.wire import RolloutRequest, RolloutResult

pytestmark = pytest.mark.timeout(180)
LONG_IMAGE = "registry.example.internal:5000/research/agents/opencode-env-task/" + "f" * 24 + ":" + "0123abcd" * 8

BOXES = """
const cell = arguments[0];
const box = (e) => {
  const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom};
};
const column = cell.closest('.task-columns > div');
const next = column.nextElementSibling;
return {cell: box(cell), next: box(next), column: box(column), scroll: cell.scrollWidth, client: cell.clientWidth,
        title: cell.title, text: cell.textContent};
"""


def _intersect(a: dict[str, float], b: dict[str, float]) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


@pytest.mark.parametrize("width", [1280, 900])
def test_a_long_image_tag_stays_in_its_column(tmp_path: Path, width: int) -> None:
    task = RolloutRequest(instruction="go", task_id="long-image", image=LONG_IMAGE, model="m" * 30)
    page = tmp_path / "rollout.html"
    page.write_text(render_page(RolloutResult(task_id="long-image", task=task)))
    with chromium() as browser:
        browser.set_window_size(width, 1400)
        browser.get(page.as_uri())
        WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#task table.kv td"))
        cell = next(
            td for td in browser.find_elements(By.CSS_SELECTOR, "#task table.kv td") if LONG_IMAGE[:40] in td.text
        )
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
        boxes = browser.execute_script(BOXES, cell)
        save_screenshot(browser, f"viewer-long-image-{width}.png")
    assert boxes["text"] == LONG_IMAGE
    assert boxes["cell"]["right"] <= boxes["column"]["right"] + 0.5
    assert not _intersect(boxes["cell"], boxes["next"])
    assert boxes["scroll"] <= boxes["client"] + 1
    assert boxes["title"] == LONG_IMAGE
