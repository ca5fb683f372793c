"""The viewer page in a real headless Chromium: what a person sees, and that the page never touches the network."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.testing.script import demo_script
from opencode_env.viewer import render_page
from opencode_env.wire.models import CommandResult, RolloutResult, RolloutTurn
from tests.browser import NETWORK_SCHEMES, chromium, requested_urls, rgb, save_screenshot
from tests.helpers import rollout

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as session:
        yield session


def open_page(browser: WebDriver, result: RolloutResult, tmp_path: Path) -> str:
    page = tmp_path / "rollout.html"
    page.write_text(render_page(result))
    requested_urls(browser)
    browser.get(page.as_uri())
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.ID, "status"))
    return page.as_uri()


def token_result() -> RolloutResult:
    """One turn whose three tokens are sure, unsure and in between, with their top-k alternatives."""
    return RolloutResult(
        task_id="tokens",
        reward=0.25,
        reward_source="reward_txt",
        proxy_turns=[
            RolloutTurn(
                turn=0,
                completion_tokens=["Sure", " maybe", " ok"],
                completion_token_ids=[101, 202, 303],
                per_token_logps=[-0.01, -4.5, -0.7],
                top_logprobs=[
                    [("Sure", -0.01, 101), ("Yes", -4.7, 111)],
                    [(" perhaps", -0.3, 212), (" maybe", -4.5, 202), (" never", -5.25, 222)],
                    [(" ok", -0.7, 303), (" fine", -0.9, 313)],
                ],
                finish_reason="stop",
                latency_s=0.5,
                ttft_s=0.1,
                request={"messages": [{"role": "user", "content": "Say something"}]},
            )
        ],
    )


async def test_a_real_rollout_shows_its_status_reward_turns_and_no_network(
    browser: WebDriver, backend: LocalBackend, tmp_path: Path
) -> None:
    result = (await rollout(backend, demo_script())).result
    assert result.status == "completed"
    page_url = open_page(browser, result, tmp_path)
    assert browser.find_element(By.ID, "status").text == "completed"
    assert browser.find_element(By.ID, "reward").text == "1.0"
    assert browser.find_element(By.ID, "turn-count").text == str(len(result.proxy_turns)) == "3"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns .turn")) == 3
    tool_rows = browser.find_elements(By.CSS_SELECTOR, "#tool-calls tr")
    assert [row.text.split()[0] for row in tool_rows[1:]] == ["write", "bash"]
    segments = browser.find_elements(By.CSS_SELECTOR, "#phase-bar .seg")
    assert "agent" in [segment.get_attribute("data-phase") for segment in segments]
    first_turn = browser.find_element(By.ID, "turn-0")
    assert "Create /home/user/workdir/add.py" in first_turn.text
    assert len(first_turn.find_elements(By.CSS_SELECTOR, ".tok")) == len(result.proxy_turns[0].completion_tokens)
    screenshot = save_screenshot(browser, "viewer-real-rollout.png")
    assert screenshot.stat().st_size > 10_000
    urls = requested_urls(browser)
    assert page_url in urls
    assert [url for url in urls if url.startswith(NETWORK_SCHEMES)] == []


def test_token_colour_follows_its_logprob_and_the_popup_shows_the_alternatives(
    browser: WebDriver, tmp_path: Path
) -> None:
    open_page(browser, token_result(), tmp_path)
    # Turns are built as they scroll into view: wait for the first one's tokens (a busy machine renders late).
    WebDriverWait(browser, 20).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#turn-0 .tok")) == 3)
    sure, unsure, middle = browser.find_elements(By.CSS_SELECTOR, "#turn-0 .tok")
    colours = [rgb(span.value_of_css_property("background-color")) for span in (sure, unsure, middle)]
    assert colours[0][1] > colours[0][0]
    assert colours[1][0] > colours[1][1]
    assert len(set(colours)) == 3

    ActionChains(browser).move_to_element(unsure).perform()
    popup = browser.find_element(By.ID, "tok-popup")
    WebDriverWait(browser, 5).until(lambda _: popup.is_displayed())
    assert popup.find_element(By.CLASS_NAME, "popup-token").text == '" maybe"'
    assert popup.find_element(By.CLASS_NAME, "popup-id").text == "id: 202"
    assert popup.find_element(By.CLASS_NAME, "popup-logprob").text.startswith("logprob: -4.5000")
    rows = [row.text for row in popup.find_elements(By.CSS_SELECTOR, "table.topk tr")[1:]]
    assert rows == [
        f'" perhaps" -0.3000 {100 * math.exp(-0.3):.1f}% 212',
        f'" maybe" -4.5000 {100 * math.exp(-4.5):.1f}% 202',
        f'" never" -5.2500 {100 * math.exp(-5.25):.1f}% 222',
    ]
    chosen = popup.find_element(By.CSS_SELECTOR, "tr.chosen")
    assert chosen.text.startswith('" maybe"')

    sure.click()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "summary")).perform()
    assert popup.is_displayed()
    assert popup.find_element(By.CLASS_NAME, "popup-id").text == "id: 101"
    save_screenshot(browser, "viewer-token-popup.png")


def test_a_thousand_turns_are_built_only_as_they_scroll_into_view(browser: WebDriver, tmp_path: Path) -> None:
    turn = RolloutTurn(
        turn=0, completion_tokens=["x"] * 300, completion_token_ids=[1] * 300, per_token_logps=[-0.5] * 300
    )
    turns = [turn.model_copy(update={"turn": index}) for index in range(1000)]
    open_page(browser, RolloutResult(task_id="long", proxy_turns=turns), tmp_path)
    assert browser.find_element(By.ID, "turn-count").text == "1000"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns .turn")) == 1000
    rendered = browser.find_elements(By.CSS_SELECTOR, "#turns .turn[data-rendered]")
    assert 0 < len(rendered) < 50
    last = browser.find_element(By.ID, "turn-999")
    browser.execute_script("arguments[0].scrollIntoView()", last)
    WebDriverWait(browser, 10).until(lambda _: last.get_attribute("data-rendered") == "1")
    assert len(last.find_elements(By.CSS_SELECTOR, ".tok")) == 300
    assert len(browser.find_elements(By.CSS_SELECTOR, "#turns .turn[data-rendered]")) < 100


def test_hostile_text_is_shown_as_text_and_never_runs(browser: WebDriver, tmp_path: Path) -> None:
    attack = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    result = RolloutResult(
        task_id="hostile",
        error=attack,
        verify_results=[CommandResult(cmd=attack, exit_code=1, stdout=attack)],
        proxy_turns=[
            RolloutTurn(
                turn=0,
                completion_tokens=[attack],
                per_token_logps=[-1.0],
                request={"messages": [{"role": "user", "content": attack}]},
            )
        ],
        files={"evil.html": attack},
    )
    page_url = open_page(browser, result, tmp_path)
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_element(By.ID, "error").text == attack
    assert browser.find_element(By.CSS_SELECTOR, "#turn-0 .tok").text == attack
    assert browser.find_elements(By.TAG_NAME, "img") == []
    urls = requested_urls(browser)
    assert page_url in urls
    assert [url for url in urls if url.startswith(NETWORK_SCHEMES)] == []


class ResultWithSequences(RolloutResult):
    """A result as the training work will shape it: sequences and a summary the viewer has never been told about."""

    training_sequences: list[dict[str, object]]
    training_summary: dict[str, object]


def test_training_sequences_and_unknown_fields_are_shown_when_present(browser: WebDriver, tmp_path: Path) -> None:
    sequence = {
        "prompt_ids": [1, 2, 3],
        "completion_ids": [10, 11, 12, 13],
        "logprobs": [-0.1, 0.0, 0.0, -2.0],
        "env_mask": [1, 0, 0, 1],
        "turns": [0, 1],
        "started": "first",
    }
    result = ResultWithSequences(
        task_id="trainable",
        training_sequences=[sequence],
        training_summary={"sequences": 1, "forks": 0, "aligned": True},
    )
    open_page(browser, result, tmp_path)
    block = browser.find_element(By.ID, "sequences")
    block.find_element(By.TAG_NAME, "summary").click()
    # The block fills itself when opened; on a busy machine that can take a moment.
    WebDriverWait(browser, 20).until(lambda _: block.find_elements(By.CSS_SELECTOR, "details.sequence > summary"))
    block.find_element(By.CSS_SELECTOR, "details.sequence > summary").click()
    WebDriverWait(browser, 20).until(lambda _: "started: first" in block.text)
    assert "3 prompt ids · 4 completion ids (2 model, 2 environment)" in block.text
    assert "started: first" in block.text
    strip = block.find_elements(By.CSS_SELECTOR, ".seq-strip span")
    assert [span.get_attribute("class") for span in strip] == ["model", "env", "env", "model"]
    other = browser.find_element(By.ID, "other")
    other.find_element(By.TAG_NAME, "summary").click()
    WebDriverWait(browser, 20).until(lambda _: other.find_elements(By.CSS_SELECTOR, "details details > summary"))
    other.find_element(By.CSS_SELECTOR, "details details > summary").click()
    WebDriverWait(browser, 20).until(lambda _: '"aligned": true' in other.text)
