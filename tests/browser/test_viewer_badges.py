"""Badges that cannot mislead, in a real headless Chromium: a reward-0 Harbor attempt whose test.sh exited 0 shows
no green verify badge (the exit code is not the grade), while a setup command's exit 0 stays green."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from opencode_env.testing.chromium import chromium, rgb, save_screenshot
from opencode_env.viewer import render_page
from opencode_env.wire import CommandResult, RolloutResult

pytestmark = pytest.mark.timeout(180)


def test_a_reward_zero_attempt_shows_no_green_verify_badge(tmp_path: Path) -> None:
    passed_setup = CommandResult(cmd="true", exit_code=0, stdout="", stderr="", duration_s=0.1)
    graded = CommandResult(cmd="bash /tests/test.sh", exit_code=0, stdout="1 failed", stderr="", duration_s=1.0)
    result = RolloutResult(
        task_id="harbor-zero",
        reward=0.0,
        reward_source="reward_txt",
        setup_results=[passed_setup],
        verify_results=[graded],
    )
    page = tmp_path / "rollout.html"
    page.write_text(render_page(result))
    with chromium() as browser:
        browser.get(page.as_uri())
        WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#verify .badge"))
        browser.find_element(By.CSS_SELECTOR, "#setup summary").click()
        verify = browser.find_element(By.CSS_SELECTOR, "#verify .command .badge")
        setup = browser.find_element(By.CSS_SELECTOR, "#setup .command .badge")
        save_screenshot(browser, "verify-badge-reward-zero.png")
        assert verify.text == "exit 0"
        assert "ok" not in verify.get_attribute("class").split()
        assert "not the grade" in verify.get_attribute("title")
        green = rgb(setup.value_of_css_property("background-color"))
        assert rgb(verify.value_of_css_property("background-color")) != green
        assert "ok" in setup.get_attribute("class").split()
