"""Evals: pass@k and the summary (pure), task loading, and whole evals on the real local backend (oracle tasks: the
solution runs in place of the agent), in-process, through the CLI and on a real server."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from opencode_env.cli.eval import add_eval_parser
from opencode_env.client.client import OpenCodeEnv
from opencode_env.evals import (
    EvalConfig,
    EvalError,
    EvalSummary,
    load_tasks,
    pass_at_k,
    run_eval,
    run_eval_sync,
    safe_task_id,
    summarize_results,
    with_model,
)
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.wire import RolloutRequest, RolloutResult, RolloutStatus, TokenUsage
from tests.server_app import app_for

WORKDIR = "/home/user/workdir"
SECRET = "sk-eval-test-never-on-disk"
ANSWERED = f'cd {WORKDIR} && test "$(cat answer.txt)" = 42'


def oracle_task(task_id: str, answer: int) -> RolloutRequest:
    return RolloutRequest(
        instruction="Write 42 to answer.txt",
        verify=[ANSWERED],
        task_id=task_id,
        solution=[f"echo {answer} > {WORKDIR}/answer.txt"],
        api_key=SECRET,
    )


SOLVED = oracle_task("solved", 42)
UNSOLVED = oracle_task("unsolved", 41)


def result(status: RolloutStatus, reward: float | None, *, tokens: int = 0, wall_s: float = 1.0) -> RolloutResult:
    usage = TokenUsage(prompt_tokens=tokens, completion_tokens=tokens // 2, llm_calls=1 if tokens else 0)
    return RolloutResult(status=status, reward=reward, usage=usage, wall_s=wall_s)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(5, 2, 1, 0.4), (5, 2, 3, 0.9), (5, 0, 3, 0.0), (5, 5, 3, 1.0), (5, 5, 1, 1.0), (10, 3, 5, 1 - 21 / 252)],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_agrees_with_the_binomials_where_they_are_huge() -> None:
    for n, c, k in [(2000, 3, 100), (2000, 1500, 7), (500, 0, 500), (300, 299, 300), (64, 10, 32)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_the_summary_scores_only_attempts_our_side_did_not_fail() -> None:
    results = {
        "a": [
            result("completed", 1.0, tokens=100, wall_s=2.0),
            result("completed", 0.0, tokens=10),
            result("sandbox_error", None, tokens=6),
            result("agent_timeout", 0.5),
            result("setup_failed", None),
        ],
        "b": [result("upstream_error", None, tokens=4), result("completed", 1.0)],
        "c": [result("timeout", None)],
    }
    summary = summarize_results(results, k=3, threshold=1.0, model="m")
    a, b, c = summary.tasks
    assert (a.attempts, a.scored, a.successes, a.k_used) == (5, 4, 1, 3)
    assert (a.pass_at_1, a.pass_at_k, a.mean_reward) == (pytest.approx(0.25), pytest.approx(0.75), 0.375)
    assert a.statuses == {"completed": 2, "agent_timeout": 1, "setup_failed": 1}
    assert a.infrastructure_failures == {"sandbox_error": 1}
    assert (a.prompt_tokens, a.completion_tokens, a.total_tokens, a.llm_calls) == (116, 58, 174, 3)
    assert a.rollout_s == pytest.approx(6.0)
    assert [outcome.attempt for outcome in a.outcomes] == [1, 2, 3, 4, 5]
    assert (b.scored, b.successes, b.k_used, b.pass_at_k) == (1, 1, 1, 1.0)
    assert (c.attempts, c.scored, c.pass_at_1, c.pass_at_k, c.mean_reward) == (1, 0, None, None, None)
    assert summary.reduced_k == ["b"]
    overall = summary.overall
    assert (overall.attempts, overall.scored, overall.successes) == (8, 5, 2)
    assert (overall.pass_at_1, overall.pass_at_k) == (pytest.approx(0.625), pytest.approx(0.875))
    assert overall.mean_reward == pytest.approx(0.5)
    assert overall.infrastructure_failures == {"sandbox_error": 1, "upstream_error": 1, "timeout": 1}
    assert overall.total_tokens == 174 + 6
    assert json.loads(summary.model_dump_json())["overall"]["total_tokens"] == 180
    table = summary.table()
    assert "pass@3" in table
    assert "b (n=1)" in table
    assert "infrastructure: sandbox_error 1, timeout 1, upstream_error 1" in table
    assert summarize_results(results, k=3, threshold=0.5).tasks[0].successes == 2


def test_safe_task_ids_are_plain_names_that_keep_ids_apart() -> None:
    assert safe_task_id("hello_v1") == "hello_v1"
    names = [safe_task_id(task_id) for task_id in ["org/task:1", "org:task/1", "org_task_1", "..", "", ".hidden"]]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z0-9@+_-][A-Za-z0-9._@+-]*", name) for name in names)


def scores(summary: EvalSummary) -> list[tuple[str, int, int, float | None, float | None]]:
    return [(task.task_id, task.scored, task.successes, task.pass_at_1, task.pass_at_k) for task in summary.tasks]


def written_files(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in root.rglob("*") if path.is_file()}


def assert_no_secret_on_disk(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(encoding="utf-8"), path


def index_links(out: Path) -> set[str]:
    return set(re.findall(r'href="([^"]+)"', (out / "index.html").read_text(encoding="utf-8")))


ALL_FOUR = {
    f"results/{task}/{n}.{kind}" for task in ("solved", "unsolved") for n in (1, 2) for kind in ("json", "html")
}


async def test_an_eval_writes_every_attempt_resumes_and_reruns_only_what_is_missing(
    backend: LocalBackend, tmp_path: Path, no_leaks: None
) -> None:
    out, lines = tmp_path / "eval", list[str]()
    summary = await run_eval(
        [SOLVED, UNSOLVED], out=out, k=2, concurrency=2, runner=InProcess(backend), report=lines.append
    )

    assert set(written_files(out)) == {*ALL_FOUR, "eval.json", "summary.json", "index.html"}
    assert scores(summary) == [("solved", 2, 2, 1.0, 1.0), ("unsolved", 2, 0, 0.0, 0.0)]
    assert [task.mean_reward for task in summary.tasks] == [1.0, 0.0]
    overall = summary.overall
    assert (overall.pass_at_1, overall.pass_at_k, overall.mean_reward) == (0.5, 0.5, 0.5)
    assert overall.statuses == {"completed": 4}
    assert EvalSummary.model_validate_json((out / "summary.json").read_text()) == summary
    saved = RolloutResult.model_validate_json((out / "results/solved/2.json").read_text())
    assert (saved.task_id, saved.status, saved.reward, saved.oracle) == ("solved", "completed", 1.0, True)
    config = EvalConfig.model_validate_json((out / "eval.json").read_text())
    assert (config.k, config.model, config.runs_on) == (2, "(oracle)", "backend local")
    assert config.tasks == ["solved", "unsolved"]

    assert lines[0] == "attempts: 4 in all, 0 done already (skipped), 4 to run"
    assert sorted(line.split(" ", 1)[0] for line in lines[1:]) == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert all(re.search(r"(un)?solved attempt [12]: completed, reward [01]\.0, \d+\.\ds$", line) for line in lines[1:])

    page = (out / "index.html").read_text()
    assert index_links(out) == {name for name in ALL_FOUR if name.endswith(".html")}
    assert "Content-Security-Policy" in page
    assert "<script" not in page
    assert re.search(r"<[^>]*\son\w+\s*=", page) is None
    assert_no_secret_on_disk(out)

    before, lines = written_files(out), []
    again = await run_eval(
        [SOLVED, UNSOLVED], out=out, k=2, concurrency=2, runner=InProcess(backend), report=lines.append
    )
    assert lines == ["attempts: 4 in all, 4 done already (skipped), 0 to run"]
    assert again.tasks == summary.tasks
    after = written_files(out)
    assert {name: after[name] for name in ALL_FOUR} == {name: before[name] for name in ALL_FOUR}

    (out / "results/unsolved/2.json").unlink()
    lines = []
    third = await run_eval(
        [SOLVED, UNSOLVED], out=out, k=2, concurrency=2, runner=InProcess(backend), report=lines.append
    )
    assert lines[0] == "attempts: 4 in all, 3 done already (skipped), 1 to run"
    assert lines[1].startswith("[1/1] unsolved attempt 2: completed, reward 0.0")
    assert len(lines) == 2
    changed = {name for name, mtime in written_files(out).items() if name in ALL_FOUR and mtime != after[name]}
    assert changed == {"results/unsolved/2.json", "results/unsolved/2.html"}
    assert scores(third) == scores(summary)


async def test_infrastructure_failures_are_kept_apart_and_rerun_on_request(
    backend: LocalBackend, tmp_path: Path, no_leaks: None
) -> None:
    out, lines = tmp_path / "eval", list[str]()
    (out / "results/solved").mkdir(parents=True)
    failed = RolloutResult(task_id="solved", status="sandbox_error", error="the box died")
    (out / "results/solved/1.json").write_text(failed.model_dump_json())
    (out / "results/solved/2.json").write_text("{ not json")

    summary = await run_eval([SOLVED], out=out, k=2, concurrency=2, runner=InProcess(backend), report=lines.append)
    assert lines[0] == f"{out / 'results/solved/2.json'} is not a RolloutResult: running that attempt again"
    assert lines[1] == (
        "attempts: 2 in all, 1 done already (skipped), 1 to run; "
        "1 of those kept failed on our side (--retry-infra runs them again)"
    )
    task = summary.tasks[0]
    assert (task.attempts, task.scored, task.successes, task.k_used, task.pass_at_k) == (2, 1, 1, 1, 1.0)
    assert task.infrastructure_failures == {"sandbox_error": 1}
    assert summary.reduced_k == ["solved"]
    assert 'class="attempt infra" href="results/solved/1.html"' in (out / "index.html").read_text()

    lines = []
    summary = await run_eval(
        [SOLVED], out=out, k=2, concurrency=2, runner=InProcess(backend), retry_infra=True, report=lines.append
    )
    assert lines[0] == "attempts: 2 in all, 1 done already (skipped), 1 to run"
    assert lines[1].startswith("[1/1] solved attempt 1: completed, reward 1.0")
    assert (summary.tasks[0].scored, summary.tasks[0].infrastructure_failures, summary.reduced_k) == (2, {}, [])


async def test_an_eval_refuses_duplicate_ids_and_another_k_or_model(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    with pytest.raises(EvalError, match="task id 'solved' appears more than once"):
        await run_eval([SOLVED, UNSOLVED, SOLVED], out=out, k=1, concurrency=1)
    assert not out.exists()
    out.mkdir()
    (out / "eval.json").write_text(EvalConfig(k=4, model="other-model", threshold=1.0).model_dump_json())
    with pytest.raises(EvalError, match=r"k=4 and model 'other-model'; this run asks for k=1 and model '\(oracle\)'"):
        await run_eval([SOLVED], out=out, k=1, concurrency=1)
    (out / "eval.json").write_text("[]")
    with pytest.raises(EvalError, match="is not an eval configuration"):
        await run_eval([SOLVED], out=out, k=1, concurrency=1)
    assert list(out.iterdir()) == [out / "eval.json"]


async def test_run_eval_sync_works_inside_a_running_event_loop(
    backend: LocalBackend, tmp_path: Path, no_leaks: None
) -> None:
    summary = run_eval_sync(
        [SOLVED], out=tmp_path / "eval", k=1, concurrency=1, runner=InProcess(backend), report=print
    )
    assert (summary.overall.successes, summary.overall.pass_at_1) == (1, 1.0)


def write_tasks(directory: Path) -> list[Path]:
    listed = directory / "tasks.json"
    listed.write_text(
        json.dumps([SOLVED.model_dump(exclude_defaults=True), UNSOLVED.model_dump(exclude_defaults=True)])
    )
    unnamed = directory / "more.jsonl"
    solved_again = SOLVED.model_dump(exclude_defaults=True, exclude={"task_id"})
    unnamed.write_text("\n" + json.dumps(solved_again) + "\n")
    return [listed, unnamed]


def test_load_tasks_reads_json_and_jsonl_and_names_unnamed_tasks(tmp_path: Path) -> None:
    paths = write_tasks(tmp_path)
    assert [task.task_id for task in load_tasks(paths, oracle=True)] == ["solved", "unsolved", "more-2"]
    assert all(task.solution is None for task in load_tasks(paths))
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"instruction": "x"}))
    assert [task.task_id for task in load_tasks([single])] == ["one"]
    with pytest.raises(EvalError, match=r"one.json: task 'one' has no solution to run with --oracle"):
        load_tasks([single], oracle=True)
    (tmp_path / "again.json").write_text(SOLVED.model_dump_json())
    with pytest.raises(EvalError, match=r"task id 'solved' appears twice, in .*tasks.json\[0\] and in .*again.json"):
        load_tasks([paths[0], tmp_path / "again.json"])
    (tmp_path / "bad.jsonl").write_text('{"instruction": "x"}\n{"instruction": "x", "k": 1}\n')
    with pytest.raises(EvalError, match=r"bad.jsonl line 2: not a RolloutRequest: k: unknown field k"):
        load_tasks([tmp_path / "bad.jsonl"])
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(EvalError, match=r"broken.json: not JSON"):
        load_tasks([tmp_path / "broken.json"])
    with pytest.raises(EvalError, match=r"missing\.json: no such file"):
        load_tasks([tmp_path / "missing.json"])


def test_with_model_overrides_only_what_is_given() -> None:
    [task] = with_model([SOLVED], model="m2", base_url="http://127.0.0.1:1/v1")
    assert (task.model, task.base_url, task.api_key, task.endpoint) == ("m2", "http://127.0.0.1:1/v1", SECRET, "")
    assert with_model([SOLVED]) == [SOLVED]
    with pytest.raises(EvalError, match="the model options do not fit"):
        with_model([SOLVED], endpoint="nonsense")


def run_cli(*argv: str | Path) -> int:
    parser = argparse.ArgumentParser(prog="opencode-env")
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["eval", *map(str, argv)])
    code: int = args.handler(args)
    return code


def test_the_cli_runs_resumes_and_refuses_another_k(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks, out = write_tasks(tmp_path), tmp_path / "eval"
    monkeypatch.setenv("EVAL_TEST_KEY", SECRET)
    common = [*tasks, "--out", out, "--oracle", "--concurrency", "3", "--api-key-env", "EVAL_TEST_KEY"]
    assert run_cli(*common, "-k", "1") == 0
    captured = capsys.readouterr()
    assert "attempts: 3 in all, 0 done already (skipped), 3 to run" in captured.err
    table = captured.out.splitlines()
    header = "task attempts scored successes pass@1 mean reward infra tokens rollout s"
    assert table[0].split() == header.split()
    assert table[4].split()[:6] == ["overall", "3", "3", "2", "0.667", "0.667"]
    assert table[-1] == f"index:      {out / 'index.html'}"
    config = json.loads((out / "eval.json").read_text())
    assert (config["inputs"], config["k"], config["model"]) == ([str(path) for path in tasks], 1, "(oracle)")
    assert_no_secret_on_disk(out)

    assert run_cli(*common, "-k", "2") == 2
    assert "holds an eval with k=1" in capsys.readouterr().err
    assert run_cli(*common, "-k", "2", "--force") == 0
    assert "attempts: 6 in all, 3 done already (skipped), 3 to run" in capsys.readouterr().err
    assert len(list((out / "results").rglob("*.json"))) == 6

    monkeypatch.delenv("EVAL_TEST_KEY")
    assert run_cli(*common, "-k", "2") == 2
    assert "--api-key-env names EVAL_TEST_KEY, which is not set" in capsys.readouterr().err


@pytest.fixture
def server_url(backend: LocalBackend) -> Iterator[str]:
    server = ThreadedServer(app_for(backend))
    server.start()
    yield server.url
    server.stop()


async def test_an_eval_runs_on_a_server(server_url: str, tmp_path: Path, no_leaks: None) -> None:
    out, lines = tmp_path / "eval", list[str]()
    summary = await run_eval(
        [SOLVED, UNSOLVED], out=out, k=2, concurrency=2, runner=OpenCodeEnv(server_url), report=lines.append
    )
    assert [(task.task_id, task.scored, task.successes) for task in summary.tasks] == [
        ("solved", 2, 2),
        ("unsolved", 2, 0),
    ]
    assert EvalConfig.model_validate_json((out / "eval.json").read_text()).runs_on == f"server {server_url}"
    assert len(lines) == 5
    assert_no_secret_on_disk(out)


def test_an_unreachable_server_stops_the_eval_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = write_tasks(tmp_path)
    assert run_cli(*tasks, "--out", tmp_path / "eval", "--oracle", "--server", "http://127.0.0.1:9") == 2
    assert "cannot open a session on the server http://127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


async def test_an_attempt_whose_server_cannot_be_reached_is_an_infrastructure_failure_of_its_own(
    tmp_path: Path,
) -> None:
    summary = await run_eval([SOLVED], out=tmp_path / "eval", k=1, runner=OpenCodeEnv("http://127.0.0.1:9"))
    assert summary.tasks[0].infrastructure_failures == {"internal_error": 1}
    saved = RolloutResult.model_validate_json((tmp_path / "eval/results/solved/1.json").read_text())
    assert "127.0.0.1:9" in (saved.error or "")
