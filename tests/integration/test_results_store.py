"""/web lists every rollout the server runs, over every transport, and its finished ones outlive a restart: the
results directory (atomic files, this user's only, the newest N, never a key) and the server around it."""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import pwd
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from opencode_env.server.result_store import ResultsDir, ResultStore, default_results_dir
from opencode_env.server.rollouts import Rollouts
from opencode_env.server.runs import Run, Runs, RunView
from opencode_env.settings import Settings, variable
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_concurrency_cap import (
    through_openenv_json_rpc,
    through_standard_mcp,
    through_step,
    through_websocket,
)
from tests.stub_server import StubServer, stub_arguments, stub_server, wait_until

pytestmark = pytest.mark.timeout(120)
SECRET = "sk-results-never-stored"


def request(task_id: str = "t", **fields: Any) -> RolloutRequest:
    return RolloutRequest.model_validate({"instruction": "go", "task_id": task_id, **fields})


def finished_run(task_id: str, **result: Any) -> tuple[RunView, RolloutResult]:
    run = Run.of(request(task_id, api_key=SECRET))
    run.finish(RolloutResult(task_id=task_id, reward=1.0, task=request(task_id, api_key=SECRET), **result))
    assert run.result is not None
    return run.view, run.result


@pytest.fixture
def results_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "results"
    monkeypatch.setenv(variable("results_dir"), str(path))
    return path


@pytest.fixture
def served(results_env: Path) -> Iterator[StubServer]:
    with stub_server(command_s=0.02) as running:
        yield running


def oracle(task_id: str) -> dict[str, Any]:
    return {**stub_arguments(task_id), "api_key": SECRET, "solution": ["true"], "verify": ["true"]}


async def listed(url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url) as http:
        rows: list[dict[str, Any]] = (await http.get("/web/api/runs")).json()
    return rows


async def test_every_transport_is_listed_and_a_restarted_server_still_lists_them(
    served: StubServer, results_env: Path
) -> None:
    url = served.url
    answers = await asyncio.gather(
        through_standard_mcp(url, "/mcp", "mcp"),
        through_standard_mcp(url, "/mcp/stream", "stream"),
        through_openenv_json_rpc(url, "json_rpc"),
        through_websocket(url, "websocket"),
        through_step(url, "step"),
    )
    returned = {answer["task_id"]: RolloutResult.model_validate(answer) for answer in answers}
    async with httpx.AsyncClient(base_url=url) as http:
        assert (await http.post("/web/api/runs", json=oracle("form"))).status_code == 202
    transports = {*returned, "form"}
    for _ in range(200):
        rows = await listed(url)
        if {row["task_id"] for row in rows if row["state"] == "finished"} >= transports:
            break
        await asyncio.sleep(0.05)
    before = {row["task_id"]: row for row in rows}
    assert set(before) == transports
    for task_id, result in returned.items():
        row = before[task_id]
        assert (row["state"], row["status"], row["failed_phase"]) == ("finished", result.status, result.failed_phase)
        where = f" in {result.failed_phase}" if result.failed_phase else ""
        assert row["message"].startswith(f"{result.status}{where}"), row
    assert (before["form"]["status"], before["form"]["failed_phase"]) == ("completed", None)
    assert before["form"]["reward"] == 1.0
    # A run is listed as finished before its files are written (the write runs in a thread): the restarted server
    # reads the directory once they are all there.
    for _ in range(1200):
        if len(list(results_env.glob("*.json"))) >= 2 * len(transports):
            break
        await asyncio.sleep(0.05)
    written = sorted(path.name for path in results_env.glob("*.json"))
    assert len(written) == 2 * len(transports), f"after 60 s, of {len(transports)} runs: {written}"

    with stub_server(command_s=0.02) as restarted:
        after = {row["task_id"]: row for row in await listed(restarted.url)}
        assert after == before
        async with httpx.AsyncClient(base_url=restarted.url) as http:
            saved = await http.get(f"/web/api/runs/{before['form']['id']}/result")
    result = RolloutResult.model_validate_json(saved.content)
    assert (result.task_id, result.reward, result.oracle) == ("form", 1.0, True)
    assert result.task is not None
    assert result.task.api_key == ""
    files = sorted(path for path in results_env.iterdir() if path.is_file())
    assert len(files) == 2 * len(transports)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert SECRET.encode() not in path.read_bytes(), path
    assert stat.S_IMODE(results_env.stat().st_mode) == 0o700


def test_the_newest_results_are_kept_and_read_back(tmp_path: Path) -> None:
    results = ResultsDir(tmp_path, keep=3)
    saved = [finished_run(f"t{i}") for i in range(5)]
    for view, result in saved:
        results.save(view, result)
    assert [view.task_id for view in results.load()] == ["t2", "t3", "t4"]
    assert len(list(tmp_path.iterdir())) == 6
    assert results.read(saved[0][0].id) is None
    newest = RolloutResult.model_validate_json(results.read(saved[4][0].id) or b"")
    assert newest.task_id == "t4"
    assert results.read("../../etc/passwd") is None


def test_a_key_in_a_result_is_never_written(tmp_path: Path) -> None:
    view, result = finished_run("keyed")
    leaky = result.model_copy(update={"task": request("keyed", api_key=SECRET)})
    ResultsDir(tmp_path).save(view, leaky)
    assert all(SECRET.encode() not in path.read_bytes() for path in tmp_path.iterdir())


def test_broken_files_are_skipped_and_stale_temporaries_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    results = ResultsDir(tmp_path)
    view, result = finished_run("good")
    results.save(view, result)
    orphan, _ = finished_run("no_result")
    (tmp_path / f"{orphan.id}.run.json").write_text(orphan.model_dump_json())
    broken, _ = finished_run("broken")
    (tmp_path / f"{broken.id}.run.json").write_text("{not json")
    (tmp_path / f"{broken.id}.json").write_text("{}")
    stale, fresh = tmp_path / ".old.tmp", tmp_path / ".writing.tmp"
    stale.write_text("x")
    fresh.write_text("x")
    os.utime(stale, (0, 0))
    with caplog.at_level(logging.WARNING, logger="opencode_env.server"):
        assert [view.task_id for view in results.load()] == ["good"]
    assert f"skipping the saved run {broken.id}" in caplog.text
    assert (stale.exists(), fresh.exists()) == (False, True)


def configured_from(environ: dict[str, str]) -> ResultsDir | None:
    settings = Settings.load(environ)
    return ResultsDir.configured(settings.results_dir, settings.results_keep)


def test_the_directory_and_its_bound_come_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_results_dir() == tmp_path / "state" / "opencode-env" / "results"
    configured = configured_from({variable("results_dir"): str(tmp_path / "mine"), variable("results_keep"): "7"})
    assert configured is not None
    assert (configured.path, configured.keep) == (tmp_path / "mine", 7)
    assert configured_from({variable("results_keep"): "0"}) is None
    with pytest.raises(ValidationError, match=variable("results_keep")):
        configured_from({variable("results_keep"): "many"})
    (tmp_path / "a-file").write_text("")
    with caplog.at_level(logging.WARNING, logger="opencode_env.server"):
        assert configured_from({variable("results_dir"): str(tmp_path / "a-file" / "results")}) is None
    assert variable("results_dir") in caplog.text


def test_a_user_without_a_home_keeps_results_in_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_such_user(uid: int) -> None:
        raise KeyError(uid)

    for name in ("XDG_STATE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_such_user)
    with caplog.at_level(logging.WARNING, logger="opencode_env.server"):
        assert configured_from({}) is None
    assert "no home directory" in caplog.text


async def test_a_rollout_its_caller_cancels_is_listed_as_cancelled_where_it_was(tmp_path: Path) -> None:
    runs = Runs(results=ResultsDir(tmp_path))
    rollouts = Rollouts(StubBackend(command_s=30.0), limit=2, runs=runs)
    call = asyncio.create_task(rollouts.run(request("cut", setup=["sleep"], solution=["true"])))
    assert await wait_until(lambda: bool(runs.views()) and runs.views()[0].phase == "setup", 10)
    assert runs.views()[0].state == "running"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    [view] = runs.views()
    assert (view.state, view.status, view.failed_phase, view.phase) == ("finished", "cancelled", "setup", "setup")
    assert view.message.startswith("cancelled in setup after ")
    saved = RolloutResult.model_validate_json(await runs.result_json(view.id) or b"")
    assert saved.error is not None
    assert saved.error.startswith("its caller cancelled the rollout")
    assert [row.id for row in Runs(results=ResultsDir(tmp_path)).views()] == [view.id]


async def test_a_directory_that_cannot_take_a_result_leaves_it_in_memory(tmp_path: Path) -> None:
    results = ResultsDir(tmp_path / "results")
    runs = Runs(keep=2, results=results)
    (tmp_path / "results").rmdir()
    (tmp_path / "results").write_text("not a directory any more")
    run = runs.begin(request("kept"))
    await runs.finish(run, RolloutResult(task_id="kept", reward=0.5))
    saved = RolloutResult.model_validate_json(await runs.result_json(run.view.id) or b"")
    assert (saved.task_id, saved.reward) == ("kept", 0.5)


def test_saves_at_once_never_remove_a_run_another_is_writing(tmp_path: Path) -> None:
    """A server saves each finished run in a thread of its own, and several servers share a directory: a save's
    pruning must never take a run written while it looked (a row would be left without its result)."""
    results = ResultsDir(tmp_path, keep=1000)
    saved = [finished_run(f"t{i}") for i in range(120)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda run: results.save(*run), saved))
    rows = {path.name.removesuffix(".run.json") for path in tmp_path.glob("*.run.json")}
    kept = {path.name.removesuffix(".json") for path in tmp_path.glob("*.json") if not path.name.endswith(".run.json")}
    assert rows == kept == {view.id for view, _ in saved}


def test_both_views_write_through_one_writer_and_sweep_what_a_killed_writer_left(tmp_path: Path) -> None:
    """The history and the results by reference share the results directory's writer: private whole files, and a
    temporary older than an hour (a server killed mid-write) is gone at the next write of either view."""
    store = ResultStore.configured(str(tmp_path), retention_s=60)
    history = ResultsDir(tmp_path)
    old = [tmp_path / ".killed.tmp", store.directory / ".killed.tmp", store.directory / "expired.gz"]
    for path in old:
        path.write_bytes(b"x")
        os.utime(path, (0, 0))
    stored = store.put(b'{"reward": 1.0}')
    view, result = finished_run("kept")
    history.save(view, result)
    history.load()
    assert not any(path.exists() for path in old)
    kept = [*tmp_path.glob("*.json"), *store.directory.glob("*.gz")]
    assert len(kept) == 3
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in kept)
    assert gzip.decompress(store.gzip_of(stored.id) or b"") == b'{"reward": 1.0}'


def test_writers_at_once_never_fail_on_each_others_temporaries(tmp_path: Path) -> None:
    """Every write sweeps the directory it writes to while other writers (threads of a server, or servers sharing
    the directory) have temporaries there that they rename or remove at any moment: a sweep must never fail on a
    file that went while it looked, for either view."""
    store = ResultStore.configured(str(tmp_path), retention_s=60)
    history = ResultsDir(tmp_path, keep=1000)
    runs = [finished_run(f"t{i}") for i in range(160)]

    def write(i: int) -> None:
        store.put(b'{"reward": 1.0}')
        history.save(*runs[i])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(len(runs))))
    assert len(list(store.directory.glob("*.gz"))) == len(runs)
    assert len(list(tmp_path.glob("*.run.json"))) == len(runs)
    assert not [*store.directory.glob(".*.tmp"), *tmp_path.glob(".*.tmp")]


def save_together(servers: list[ResultsDir], runs: list[tuple[RunView, RolloutResult]]) -> None:
    """Each server saves its run in a thread of its own, all released at one moment."""
    together = threading.Barrier(len(servers))

    def save(n: int) -> None:
        together.wait()
        servers[n].save(*runs[n])

    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(save, range(len(servers))))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_callers_only_run_survives_saves_at_once_of_other_callers(tmp_path: Path, keep: int) -> None:
    """keep + 2 servers sharing the directory each save one run of a caller of its own at the same moment: every
    caller keeps their run. A save's pruning must not count a run whose row another server has yet to write as a
    run beyond `keep` (it used to: all such runs counted as one unknown caller's)."""
    for trial in range(30):
        directory = tmp_path / str(trial)
        servers = [ResultsDir(directory, keep) for _ in range(keep + 2)]
        runs = []
        for n in range(len(servers)):
            run = Run.of(request(f"t{n}"), owner=f"caller{n}")
            run.finish(RolloutResult(task_id=f"t{n}", reward=1.0))
            assert run.result is not None
            runs.append((run.view, run.result))
        save_together(servers, runs)
        assert {view.id for view in ResultsDir(directory, keep).load()} == {view.id for view, _ in runs}
