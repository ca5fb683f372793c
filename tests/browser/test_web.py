"""The server's /web page: its API (bounded runs, the token), and a real browser running a rollout from the form."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastmcp import Client as FastMCPClient
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.runs import Run, Runner, Runs
from opencode_env.settings import variable
from opencode_env.testing.chromium import chromium, network_requests, requested_urls, save_screenshot
from opencode_env.viewer.rows import OPERATOR
from opencode_env.viewer.web import web_router
from opencode_env.wire import Phase, RolloutRequest, RolloutResult
from opencode_env.wire.answer import inline_result
from tests.server_app import app_for

TOKEN = "web-t0ken-for-tests"
SECRET = "sk-web-never-stored"
pytestmark = pytest.mark.timeout(180)


class GatedRunner:
    """A runner whose rollouts report a phase, then wait until the test opens their gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def __call__(self, request: RolloutRequest, run: Run) -> RolloutResult:
        phase: Phase = "agent"
        await run.progress(phase, "running OpenCode")
        await self.gate.wait()
        return RolloutResult(task_id=request.task_id, reward=1.0, reward_source="reward_txt")


def api_client(runs: Runs, runner: Runner) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(
        web_router(runs, lambda request, caller: runs.start(request, runner, caller), lambda _: OPERATOR)
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://web.test")


async def wait_for(predicate: Callable[[], bool]) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_the_pages_own_runs_are_bounded_and_a_running_one_is_never_evicted() -> None:
    runner = GatedRunner()
    runs = Runs(keep=2)
    async with api_client(runs, runner) as client:
        started = [await client.post("/web/api/runs", json={"instruction": "go", "task_id": f"t{i}"}) for i in (1, 2)]
        assert [response.status_code for response in started] == [202, 202]
        first = started[0].json()["id"]
        refused = await client.post("/web/api/runs", json={"instruction": "go", "task_id": "t3"})
        assert refused.status_code == 429
        assert "2 rollouts are already running" in refused.json()["detail"]
        await wait_for(lambda: all(view.phase == "agent" for view in runs.views()))
        running = (await client.get(f"/web/api/runs/{first}")).json()
        assert (running["state"], running["phase"], running["message"]) == ("running", "agent", "running OpenCode")
        assert (await client.get(f"/web/api/runs/{first}/result")).status_code == 404

        runner.gate.set()
        await wait_for(lambda: all(view.state == "finished" for view in runs.views()))
        result = await client.get(f"/web/api/runs/{first}/result")
        assert RolloutResult.model_validate_json(result.content).task_id == "t1"
        finished = (await client.get(f"/web/api/runs/{first}")).json()
        assert (finished["phase"], finished["message"]) == ("agent", "completed, reward 1.0 after 0.0s")
        runner.gate = asyncio.Event()
        assert (await client.post("/web/api/runs", json={"instruction": "go", "task_id": "t3"})).status_code == 202
        listed = [view["task_id"] for view in (await client.get("/web/api/runs")).json()]
        assert listed == ["t3", "t2", "t1"]
        runner.gate.set()
        await wait_for(lambda: runs.views()[0].state == "finished")
        listed = [view["task_id"] for view in (await client.get("/web/api/runs")).json()]
        assert listed == ["t3", "t2"]
        assert (await client.get(f"/web/api/runs/{first}")).status_code == 404


async def test_a_bad_request_names_the_field_and_its_limit() -> None:
    async with api_client(Runs(keep=2), GatedRunner()) as client:
        response = await client.post("/web/api/runs", json={"instruction": "go", "top_logprobs": 99})
        assert response.status_code == 422
        [problem] = response.json()["detail"]
        assert problem["loc"][-1] == "top_logprobs"
        assert "20" in problem["msg"]


async def test_a_runner_that_raises_leaves_a_crashed_run_with_its_error() -> None:
    async def broken(request: RolloutRequest, run: Run) -> RolloutResult:
        raise RuntimeError("the runner broke")

    runs = Runs(keep=3)
    async with api_client(runs, broken) as client:
        run_id = (await client.post("/web/api/runs", json={"instruction": "go"})).json()["id"]
        await wait_for(lambda: runs.views()[0].state != "running")
        view = (await client.get(f"/web/api/runs/{run_id}")).json()
        assert (view["state"], view["error"]) == ("crashed", "RuntimeError: the runner broke")


@pytest.fixture(scope="module")
def guarded_url(backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(variable("results_dir"), str(tmp_path_factory.mktemp("results")))
        server = ThreadedServer(app_for(backend, token=TOKEN))
    server.start()
    yield server.url
    server.stop()


def test_the_page_is_open_and_its_data_is_behind_the_token(guarded_url: str) -> None:
    page = httpx.get(f"{guarded_url}/web")
    assert page.status_code == 200
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert TOKEN not in page.text
    root = httpx.get(f"{guarded_url}/", follow_redirects=False)
    assert (root.status_code, root.headers["location"]) == (307, "/web")
    assert httpx.get(f"{guarded_url}/web/api/runs").status_code == 401
    assert httpx.post(f"{guarded_url}/web/api/runs", json={"instruction": "x"}).status_code == 401
    assert httpx.get(f"{guarded_url}/web/api/runs/x/result").status_code == 401
    authorized = {"authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{guarded_url}/web/api/runs", headers=authorized).status_code == 200


async def test_a_rollout_over_mcp_is_listed_for_token_holders_only(guarded_url: str) -> None:
    arguments = {
        "instruction": "Write 42 to answer.txt",
        "solution": ["echo 42 > answer.txt"],
        "verify": ['cd /home/user/workdir && test "$(cat answer.txt)" = 42'],
        "task_id": "over_mcp",
        "api_key": SECRET,
    }
    async with FastMCPClient(f"{guarded_url}/mcp/stream", auth=TOKEN, timeout=120) as client:
        answer = await client.call_tool("run_rollout", arguments)
    assert inline_result(answer.structured_content).reward == 1.0
    authorized = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=guarded_url) as http:
        assert (await http.get("/web/api/runs")).status_code == 401
        [row] = [
            row for row in (await http.get("/web/api/runs", headers=authorized)).json() if row["task_id"] == "over_mcp"
        ]
        assert (row["state"], row["status"], row["reward"], row["failed_phase"]) == ("finished", "completed", 1.0, None)
        assert row["message"].startswith("completed, reward 1.0 after ")
        assert (await http.get(f"/web/api/runs/{row['id']}/result")).status_code == 401
        result = await http.get(f"/web/api/runs/{row['id']}/result", headers=authorized)
    assert RolloutResult.model_validate_json(result.content).task_id == "over_mcp"
    assert SECRET not in result.text
    assert SECRET not in str(row)


FIRST_ROW = """
const row = document.querySelector('#runs tbody tr[data-state]');
if (!row) return null;
const steps = [...row.querySelectorAll('.phase-steps span')];
return {state: row.dataset.state, phase: row.querySelector('.run-phase').textContent, task: row.children[1].textContent,
        current: steps.filter((s) => s.classList.contains('current')).map((s) => s.textContent).join(),
        done: steps.filter((s) => s.classList.contains('done')).map((s) => s.textContent)};
"""


def first_row(browser: WebDriver) -> dict[str, Any] | None:
    """The newest run's row as a person reads it, read in one step (the page rebuilds the table as it polls)."""
    row: dict[str, Any] | None = browser.execute_script(FIRST_ROW)
    return row


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as session:
        yield session


def test_the_form_runs_a_rollout_with_live_phases_and_opens_it_in_the_viewer(
    browser: WebDriver, guarded_url: str
) -> None:
    wait = WebDriverWait(browser, 90, poll_frequency=0.05)
    requested_urls(browser)
    browser.get(f"{guarded_url}/web")
    token_input = browser.find_element(By.ID, "token-input")
    wait.until(lambda _: token_input.is_displayed())
    token_input.send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
    wait.until(lambda b: b.find_element(By.ID, "run-form").is_displayed())
    assert browser.execute_script("return sessionStorage.getItem('opencode-env-token')") == TOKEN

    with ScriptedModelServer(demo_script()) as model:
        form = browser.find_element(By.ID, "run-form")
        form.find_element(By.NAME, "instruction").send_keys(DEMO_INSTRUCTION)
        form.find_element(By.NAME, "verify").send_keys("\n".join(DEMO_VERIFY))
        form.find_element(By.NAME, "endpoint").send_keys("vllm")
        form.find_element(By.NAME, "base_url").send_keys(model.base_url)
        form.find_element(By.NAME, "model").send_keys("scripted-policy")
        form.find_element(By.NAME, "task_id").send_keys("web_demo")
        browser.find_element(By.ID, "run-button").click()

        running = wait.until(lambda b: (row := first_row(b)) and row["phase"].startswith("agent") and row)
        assert running["state"] == "running"
        assert running["current"] == "agent"
        assert running["done"] == ["sandbox", "install", "prepare", "setup", "proxy"]
        save_screenshot(browser, "web-running.png")
        finished = wait.until(lambda b: (row := first_row(b)) and row["state"] != "running" and row)
        assert finished["state"] == "finished"
        assert finished["phase"].startswith("completed, reward 1.0 after ")
        assert finished["done"] == ["sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect"]

    row = browser.find_element(By.CSS_SELECTOR, "#runs tbody tr")
    assert row.find_element(By.CLASS_NAME, "run-state").text == "finished"
    assert row.find_element(By.CLASS_NAME, "run-status").text == "completed"
    assert row.find_element(By.CLASS_NAME, "run-reward").text == "1.0"
    row.find_element(By.CLASS_NAME, "view-run").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#viewer #status"))
    assert browser.find_element(By.CSS_SELECTOR, "#viewer #status").text == "completed"
    assert browser.find_element(By.CSS_SELECTOR, "#viewer #reward").text == "1.0"
    assert browser.find_element(By.CSS_SELECTOR, "#viewer #turn-count").text == "3"
    assert browser.find_element(By.CSS_SELECTOR, "#viewer #training-line").text.startswith("1 sequence(s)")
    assert browser.find_elements(By.CSS_SELECTOR, "#viewer #training-none") == []
    save_screenshot(browser, "web-finished.png")
    urls = network_requests(browser)
    assert urls
    assert [url for url in urls if not url.startswith(guarded_url + "/")] == []


def test_the_form_runs_an_oracle_without_a_model(browser: WebDriver, guarded_url: str) -> None:
    wait = WebDriverWait(browser, 60, poll_frequency=0.05)
    browser.get(f"{guarded_url}/web")
    if browser.execute_script("return sessionStorage.getItem('opencode-env-token')") != TOKEN:
        browser.find_element(By.ID, "token-input").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
    form = wait.until(
        lambda b: b.find_element(By.ID, "run-form") if b.find_element(By.ID, "run-form").is_displayed() else None
    )
    form.find_element(By.NAME, "instruction").send_keys("Write 42 to answer.txt")
    form.find_element(By.NAME, "verify").send_keys('cd /home/user/workdir && test "$(cat answer.txt)" = 42')
    form.find_element(By.NAME, "solution").send_keys("echo 42 > /home/user/workdir/answer.txt")
    form.find_element(By.NAME, "task_id").send_keys("web_oracle")
    browser.find_element(By.ID, "run-button").click()
    wait.until(lambda b: (row := first_row(b)) and row["state"] == "finished" and "web_oracle" in row["task"])
    row = browser.find_element(By.CSS_SELECTOR, "#runs tbody tr")
    assert row.find_element(By.CLASS_NAME, "run-status").text == "completed"
    assert row.find_element(By.CLASS_NAME, "run-reward").text == "1.0"
    row.find_element(By.CLASS_NAME, "view-run").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#viewer #solution"))
    assert "oracle run" in browser.find_element(By.ID, "summary").text
    assert "echo 42" in browser.find_element(By.ID, "solution").text
