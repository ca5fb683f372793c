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
from opencode_env.scripted.script import demo_script
from opencode_env.testing.chromium import NETWORK_SCHEMES, chromium, requested_urls, rgb, save_screenshot
from opencode_env.viewer import render_page
from opencode_env.viewer.page import training_view
from opencode_env.wire import (
    CommandResult,
    PhaseTimings,
    RolloutRequest,
    RolloutResult,
    RolloutTurn,
    Sampling,
    ToolCallSummary,
)
from tests.helpers import rollout
from tests.integration.test_viewer_page import forking_result

T0 = 1_750_000_000.0

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
                    [("Yes", -4.7, 111), ("Sure", -0.01, 101)],
                    [(" never", -5.25, None), (" maybe", -4.5, None), (" perhaps", -0.3, 212)],
                    [(" fine", -0.9, 313), (" good", -0.8, None)],
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
    # A turn's body is drawn when it scrolls into view (an IntersectionObserver's callback, later on a loaded machine).
    browser.execute_script("arguments[0].scrollIntoView()", first_turn)
    WebDriverWait(browser, 20).until(lambda _: not first_turn.find_elements(By.CSS_SELECTOR, ".pending"))
    assert "Create /home/user/workdir/add.py" in first_turn.text
    assert len(first_turn.find_elements(By.CSS_SELECTOR, ".tok")) == len(result.proxy_turns[0].completion_tokens)
    screenshot = save_screenshot(browser, "viewer-real-rollout.png")
    assert screenshot.stat().st_size > 10_000
    # The agent phase on one axis: a bar per model call and per timed tool run, after OpenCode's start-up.
    timeline = browser.find_element(By.ID, "timeline")
    assert len(timeline.find_elements(By.CSS_SELECTOR, ".tl-call")) == 3
    timed_tools = [call for call in result.tool_calls if call.started_at is not None]
    assert len(timeline.find_elements(By.CSS_SELECTOR, ".tl-tool")) == len(timed_tools) == 2
    assert browser.find_element(By.ID, "tl-startup").text.startswith("OpenCode start-up")
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "phases"))
    save_screenshot(browser, "viewer-real-timeline.png")
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
    # Most probable first; the sampled token marked, its id known from completion_token_ids; other ids unknown: "?".
    rows = [row.text for row in popup.find_elements(By.CSS_SELECTOR, "table.topk tr")[1:]]
    assert rows == [
        f'" perhaps" -0.3000 {100 * math.exp(-0.3):.1f}% 212',
        f'▶ " maybe" -4.5000 {100 * math.exp(-4.5):.1f}% 202',
        f'" never" -5.2500 {100 * math.exp(-5.25):.1f}% ?',
    ]
    chosen = popup.find_element(By.CSS_SELECTOR, "tr.chosen")
    assert chosen.text.startswith('▶ " maybe"')
    save_screenshot(browser, "viewer-topk-sorted.png")

    # The sampled " ok" is not among the recorded alternatives: it is added, marked, in its place by probability.
    ActionChains(browser).move_to_element(middle).perform()
    WebDriverWait(browser, 5).until(lambda _: popup.find_element(By.CLASS_NAME, "popup-id").text == "id: 303")
    rows = [row.text for row in popup.find_elements(By.CSS_SELECTOR, "table.topk tr")[1:]]
    assert [row.split(" -")[0] for row in rows] == ['▶ " ok" (not in top-k)', '" good"', '" fine"']
    assert [row.split()[-1] for row in rows] == ["303", "?", "313"]

    sure.click()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "summary")).perform()
    assert popup.is_displayed()
    assert popup.find_element(By.CLASS_NAME, "popup-id").text == "id: 101"
    save_screenshot(browser, "viewer-token-popup.png")


def test_packed_turns_show_every_token_whose_text_or_id_an_earlier_turn_or_its_rank_carries(
    browser: WebDriver, tmp_path: Path
) -> None:
    """Schema 5 on the page: the second turn's texts are in the first turn's vocab only, and its sampled tokens travel
    as ranks among their alternatives (one does not, and comes from `ids`)."""

    def packed_turn(number: int, ids: list[int], logprobs: list[float]) -> RolloutTurn:
        texts = {7: " seven", 8: " eight", 9: " nine"}
        return RolloutTurn(
            turn=number,
            completion_token_ids=ids,
            completion_tokens=[texts[i] for i in ids],
            per_token_logps=logprobs,
            top_logprobs=[[(" seven", -0.5, 7), (" eight", -1.5, 8)] for _ in ids],
            request={"messages": [{"role": "user", "content": f"turn {number}"}]},
        )

    result = RolloutResult(
        task_id="packed",
        proxy_turns=[packed_turn(0, [7, 8, 9], [-0.5, -1.5, -6.0]), packed_turn(1, [8, 9, 7], [-1.5, -6.0, -0.5])],
    )
    wire = result.model_dump_json()
    assert '"sampled_rank":"' in wire
    assert '"vocab":[]' in wire
    open_page(browser, result, tmp_path)
    assert_seven_eight_nine_in_two_turns(browser)
    nine = browser.find_elements(By.CSS_SELECTOR, "#turn-1 .tok")[1]
    ActionChains(browser).move_to_element(nine).perform()
    popup = browser.find_element(By.ID, "tok-popup")
    WebDriverWait(browser, 5).until(lambda _: popup.find_element(By.CLASS_NAME, "popup-id").text == "id: 9")
    assert popup.find_element(By.CLASS_NAME, "popup-logprob").text.startswith("logprob: -6.0000")


def test_packed_turns_whose_alternatives_have_no_ids_show_every_text_id_and_logprob(
    browser: WebDriver, tmp_path: Path
) -> None:
    """Schema 6 on the page, as vLLM names alternatives (by text, no id): their texts in the result's table (the
    second turn adds one text and reuses the first turn's), ranked sampled tokens' ids in `ids`, one unranked token
    (its id and logprob in `ids`/`logprobs`)."""
    texts = {7: " seven", 8: " eight", 9: " nine"}

    def by_text_turn(number: int, ids: list[int], logprobs: list[float], extra: str) -> RolloutTurn:
        return RolloutTurn(
            turn=number,
            completion_token_ids=ids,
            completion_tokens=[texts[i] for i in ids],
            per_token_logps=logprobs,
            top_logprobs=[[(" seven", -0.5, None), (" eight", -1.5, None), (extra, -7.0, None)] for _ in ids],
            request={"messages": [{"role": "user", "content": f"turn {number}"}]},
        )

    result = RolloutResult(
        task_id="by-text",
        proxy_turns=[
            by_text_turn(0, [7, 8, 9], [-0.5, -1.5, -6.0], " else"),
            by_text_turn(1, [8, 9, 7], [-1.5, -6.0, -0.5], " other"),
        ],
    )
    wire = result.model_dump_json()
    assert '"top_ids":""' in wire
    assert '"alt_texts":[" seven"," eight"," else"]' in wire
    assert '"alt_texts":[" other"]' in wire
    open_page(browser, result, tmp_path)
    assert_seven_eight_nine_in_two_turns(browser)
    popup = browser.find_element(By.ID, "tok-popup")
    for index, (want_id, want_logprob) in enumerate(((8, "-1.5000"), (9, "-6.0000"))):
        tok = browser.find_elements(By.CSS_SELECTOR, "#turn-1 .tok")[index]
        ActionChains(browser).move_to_element(tok).perform()
        WebDriverWait(browser, 5).until(
            lambda _, i=want_id: popup.find_element(By.CLASS_NAME, "popup-id").text == f"id: {i}"
        )
        assert popup.find_element(By.CLASS_NAME, "popup-logprob").text.startswith(f"logprob: {want_logprob}")
    rows = [
        [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        for row in popup.find_elements(By.CSS_SELECTOR, "table.topk tr")[1:]
    ]
    assert [(row[1], row[2], row[4]) for row in rows] == [
        ('" seven"', "-0.5000", "?"),
        ('" eight"', "-1.5000", "?"),
        ('" nine" (not in top-k)', "-6.0000", "9"),
        ('" other"', "-7.0000", "?"),
    ]


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
        task=RolloutRequest(instruction=attack, setup=[attack], env={"X": attack}, files={attack: attack}),
        timings=PhaseTimings(agent_s=5.0),
        tool_calls=[ToolCallSummary(tool=attack, status=attack, title=attack, started_at=T0, ended_at=T0 + 1)],
        warnings=[attack],
    )
    page_url = open_page(browser, result, tmp_path)
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_element(By.ID, "error").text == attack
    assert browser.find_element(By.CSS_SELECTOR, "#task .task-instruction").text == attack
    assert str(browser.find_element(By.CSS_SELECTOR, "#timeline .tl-tool").get_attribute("title")).startswith(attack)
    assert browser.find_element(By.ID, "warnings").text == "warning: " + attack
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#turn-0 .tok"))
    assert browser.find_element(By.CSS_SELECTOR, "#turn-0 .tok").text == attack
    assert browser.find_elements(By.TAG_NAME, "img") == []
    urls = requested_urls(browser)
    assert page_url in urls
    assert [url for url in urls if url.startswith(NETWORK_SCHEMES)] == []


def test_the_task_section_shows_what_the_rollout_was_asked(browser: WebDriver, tmp_path: Path) -> None:
    task = RolloutRequest(
        instruction="Fix add() in add.py so that the tests pass.",
        image="python:3.12-slim",
        workdir="/app",
        setup=["pip install pytest"],
        verify=["pytest -q tests/"],
        sampling=Sampling(temperature=0.7, top_p=0.95),
        memory_mb=2048,
        agent_timeout_s=120,
        env={"TASK_LEVEL": "easy"},
    )
    open_page(browser, RolloutResult(task_id="task", task=task), tmp_path)
    section = browser.find_element(By.ID, "task")
    assert section.find_element(By.CLASS_NAME, "task-instruction").text == task.instruction
    for shown in ("python:3.12-slim", "/app", "pip install pytest", "pytest -q tests/", "temperature=0.7 · top_p=0.95"):
        assert shown in section.text
    assert "2048 MiB" in section.text
    assert "TASK_LEVEL" in section.text
    assert "easy" not in section.text
    browser.execute_script("arguments[0].scrollIntoView()", section)
    save_screenshot(browser, "viewer-task.png")

    open_page(browser, RolloutResult(task_id="old"), tmp_path)
    assert "not recorded" in browser.find_element(By.ID, "task").text


def timed_result() -> RolloutResult:
    """A 60 s agent phase: OpenCode starts for 50 s, then two model calls with a bash run and a read between."""

    def call(number: int, start: float, latency: float) -> RolloutTurn:
        return RolloutTurn(
            turn=number, timestamp=T0 + start, latency_s=latency, ttft_s=latency / 4, completion_tokens=["x"]
        )

    def tool(name: str, start: float, end: float | None, status: str = "completed") -> ToolCallSummary:
        return ToolCallSummary(
            tool=name, status=status, title=name, started_at=T0 + start, ended_at=None if end is None else T0 + end
        )

    return RolloutResult(
        task_id="timed",
        timings=PhaseTimings(setup_s=3.0, agent_s=60.0, verify_s=2.0),
        proxy_turns=[call(0, 50.0, 2.0), call(1, 58.0, 1.5)],
        tool_calls=[tool("bash", 52.5, 57.0), tool("read", 52.6, 52.9, "error")],
    )


def test_the_timeline_lays_out_calls_and_tool_runs_after_opencodes_start_up(browser: WebDriver, tmp_path: Path) -> None:
    open_page(browser, timed_result(), tmp_path)
    timeline = browser.find_element(By.ID, "timeline")
    calls = timeline.find_elements(By.CSS_SELECTOR, ".tl-call")
    tools = timeline.find_elements(By.CSS_SELECTOR, ".tl-tool")
    assert [bar.text for bar in calls] == ["#0", "#1"]
    assert len(tools) == 2
    assert "latency 2.00 s" in str(calls[0].get_attribute("title"))
    assert "read · error" in " ".join(str(bar.get_attribute("title")) for bar in tools)
    # The phase is 60 s and the last call ends at +59.5 s after the first began at +50 s: 50.5 s of start-up.
    startup = browser.find_element(By.ID, "tl-startup")
    assert startup.text == "OpenCode start-up 50.5 s"
    track = startup.find_element(By.XPATH, "..")
    assert startup.size["width"] / track.size["width"] == pytest.approx(50.5 / 60, abs=0.01)
    # The bash run and the read overlap, so they sit in two lanes.
    assert len({bar.location["y"] for bar in tools}) == 2
    legend = browser.find_element(By.ID, "timeline-legend").text
    assert "start-up 50.5 s · model calls busy 3.50 s · tools busy 4.50 s" in legend
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "phases"))
    save_screenshot(browser, "viewer-timeline.png")
    browser.execute_script("window.scrollTo(0, 0)")
    calls[1].click()
    # A call's bar opens its turn: the page scrolls the turn's card into view.
    card_in_view = (
        "const r = document.getElementById('turn-1').getBoundingClientRect();"
        "return window.scrollY > 0 && r.top >= 0 && r.bottom <= window.innerHeight;"
    )
    WebDriverWait(browser, 5).until(lambda b: b.execute_script(card_in_view))


def test_a_result_without_times_names_why_there_is_no_timeline(browser: WebDriver, tmp_path: Path) -> None:
    old = RolloutResult(task_id="old", timings=PhaseTimings(agent_s=12.0), proxy_turns=[RolloutTurn(turn=0)])
    open_page(browser, old, tmp_path)
    assert "no model call or tool run carries a start time" in browser.find_element(By.ID, "timeline-none").text
    assert browser.find_elements(By.ID, "timeline") == []


def test_sequences_forks_skipped_turns_and_coverage_are_listed(browser: WebDriver, tmp_path: Path) -> None:
    result = forking_result()
    open_page(browser, result, tmp_path)
    block = browser.find_element(By.ID, "sequences")
    assert browser.find_element(By.ID, "training-line").text.startswith("3 sequence(s) · 1 fork(s) · usable")
    rows = [row.find_elements(By.TAG_NAME, "td") for row in block.find_elements(By.CSS_SELECTOR, "tr.sequence-row")]
    assert [[cell.text for cell in row[:6]] for row in rows] == [
        ["0", "first", "0–1", "3", "3", "2"],
        ["1", "drift", "2", "9", "2", "0"],
        ["2", "after_unusable_turn", "4", "9", "3", "0"],
    ]
    assert "the TRL row" in rows[2][7].text
    assert len(rows[0][7].find_elements(By.CSS_SELECTOR, ".fork-mark")) == 1
    shape = [span.get_attribute("class") for span in rows[0][7].find_elements(By.CSS_SELECTOR, ".seq-shape > span")]
    assert shape == ["prompt", "model", "env", "model", "fork-mark"]
    fork = [
        cell.text for cell in block.find_elements(By.CSS_SELECTOR, "#fork-list tr")[1].find_elements(By.TAG_NAME, "td")
    ]
    assert fork == ["2", "0", "2", "3 / 9", "template_drift", "1"]
    assert "turn 3: no engine prompt ids" in browser.find_element(By.ID, "skipped").text
    assert "unattributed turns 5" in browser.find_element(By.ID, "unattributed").text
    summary = training_view(result).summary
    assert summary is not None
    # TrainingSummary.coverage is being added alongside this page: check its table when the summary carries it.
    expected = summary.model_dump().get("coverage")
    if expected is not None:
        trl = expected["trl_row"]
        coverage = [row.text for row in block.find_elements(By.CSS_SELECTOR, "#coverage tr")[1:]]
        assert len(coverage) == len(expected)
        assert coverage[0].startswith(f"trl row {trl['covered_tokens']} of {trl['agent_tokens']} agent tokens")
    browser.execute_script("arguments[0].scrollIntoView()", block)
    save_screenshot(browser, "viewer-sequences.png")


def test_the_coverage_table_is_left_out_when_the_summary_has_none(browser: WebDriver, tmp_path: Path) -> None:
    open_page(browser, forking_result(), tmp_path)
    assert (
        browser.execute_script(
            """const data = JSON.parse(document.getElementById("rollout-data").textContent);
        const training = JSON.parse(document.getElementById("training-data").textContent);
        delete training.summary.coverage;
        window.OpencodeViewer.render(document.getElementById("app"), data, training);
        return document.querySelectorAll("#sequence-list tr.sequence-row").length;"""
        )
        == 3
    )
    assert browser.find_elements(By.ID, "coverage") == []
    browser.execute_script(
        """window.OpencodeViewer.render(document.getElementById("app"),
        JSON.parse(document.getElementById("rollout-data").textContent));"""
    )
    assert "not computed for this view" in browser.find_element(By.ID, "training-none").text


class ResultWithMore(RolloutResult):
    """A result from a newer server, with a field this viewer has never been told about."""

    training_notes: dict[str, object]


def test_unknown_fields_are_shown_when_present(browser: WebDriver, tmp_path: Path) -> None:
    open_page(browser, ResultWithMore(task_id="newer", training_notes={"aligned": True}), tmp_path)
    other = browser.find_element(By.ID, "other")
    other.find_element(By.TAG_NAME, "summary").click()
    # The block fills itself when opened; on a busy machine that can take a moment.
    WebDriverWait(browser, 20).until(lambda _: other.find_elements(By.CSS_SELECTOR, "details details > summary"))
    field = [s for s in other.find_elements(By.CSS_SELECTOR, "details details > summary") if s.text == "training_notes"]
    field[0].click()
    WebDriverWait(browser, 20).until(lambda _: '"aligned": true' in other.text)


def assert_seven_eight_nine_in_two_turns(browser: WebDriver) -> None:
    """The two turns' tokens as the page shows them, once each turn has rendered its three."""
    for number, want in ((0, [" seven", " eight", " nine"]), (1, [" eight", " nine", " seven"])):
        tokens = f"#turn-{number} .tok"
        browser.execute_script(f"document.getElementById('turn-{number}').scrollIntoView()")
        WebDriverWait(browser, 20).until(lambda b, css=tokens: len(b.find_elements(By.CSS_SELECTOR, css)) == 3)
        assert [tok.text for tok in browser.find_elements(By.CSS_SELECTOR, tokens)] == want
