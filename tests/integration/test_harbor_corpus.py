"""The conformance corpus (tests/harbor_corpus/): tasks in the shapes of public Harbor tasks, each README naming the
one it mirrors, run as Harbor runs them on the local backend: built from environment/ offline, the oracle
(solution/solve.sh) reaching 1.0 and doing nothing 0.0. Each also checks the Harbor feature its shape exercises."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.tasks.harbor import entrypoint_command, request_from_task_dir
from opencode_env.wire import RolloutRequest, RolloutResult

CORPUS = Path(__file__).resolve().parents[1] / "harbor_corpus"
TASKS = sorted(path.name for path in CORPUS.iterdir() if (path / "task.toml").is_file())


@pytest.fixture(scope="module", autouse=True)
def base_image() -> str:
    return build_base_image()


def test_every_task_says_what_it_mirrors() -> None:
    assert TASKS
    for name in TASKS:
        assert "Mirrors" in (CORPUS / name / "README.md").read_text(), name


async def _oracle_and_nothing(name: str, backend: LocalBackend) -> tuple[RolloutRequest, RolloutResult, RolloutResult]:
    request = request_from_task_dir(CORPUS / name, oracle=True)
    solved = await run_rollout(request, backend)
    nothing = await run_rollout(request.doing_nothing(), backend)
    return request, solved, nothing


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", TASKS)
async def test_the_oracle_solves_it_and_doing_nothing_does_not(backend: LocalBackend, name: str) -> None:
    request, solved, nothing = await _oracle_and_nothing(name, backend)
    assert (solved.status, solved.reward) == ("completed", 1.0), (solved.error, solved.solution_results)
    assert (nothing.status, nothing.reward) == ("completed", 0.0), (nothing.error, nothing.verify_results)
    assert solved.solution_results[0].exit_code == 0
    if name == "env-tables":
        assert request.workdir == "/workspace", "[environment] workdir wins over the image's"
        assert solved.files["greet.sh"].startswith('#!/bin/bash\necho "Hello from')
        assert "EXPECTED_GREETING" not in request.env, "the verifier's env is verify's alone"
    if name == "root-tool":
        assert (solved.identities["agent"], nothing.identities["agent"]) == ("root", "root"), "Harbor's oracle is root"
    if name == "entrypoint-service":
        assert request.setup == [entrypoint_command(["/entrypoint.sh"])], "the image's ENTRYPOINT starts first"
        assert (solved.identities["setup"], solved.setup_results[0].exit_code) == ("root", 0)
    if name == "kv-sidecar":
        assert [(s.name, s.awaited, s.workdir) for s in request.services] == [("kv", "service_healthy", "/srv")]
        assert "kv (local-" in solved.enforcement["services"], solved.enforcement
    if name == "artifacts-notes":
        assert request.artifacts == ["/srv/notes", "/app/answer.txt", "/logs/artifacts"]
        assert solved.artifacts == {
            "/srv/notes/notes.md": "# Notes\n\n19 + 23 = 42, by shell arithmetic.\n",
            "/app/answer.txt": "42\n",
            "/logs/artifacts/report.txt": "answer: 42; reward 1\n",
        }, solved.artifacts_extra
        assert nothing.artifacts == {"/logs/artifacts/report.txt": "answer: none; reward 0\n"}
        assert [line.split(":")[0] for line in nothing.artifacts_extra] == ["/srv/notes", "/app/answer.txt"]
    if name == "skills-recipe":
        assert request.skills_dir == "/skills", "the image's skills are given to OpenCode"
    if name == "multi-step-greet":
        assert [(s.name, s.status, s.reward) for s in solved.steps] == [
            ("scaffold", "completed", 1.0),
            ("implement", "completed", 1.0),
        ], solved.steps
        assert [(s.name, s.status, s.reward) for s in nothing.steps] == [
            ("scaffold", "below_min_reward", 0.0),
            ("implement", "not_run", None),
        ], "a step under its min_reward stops the run"
        assert solved.files["seed.txt"] == "seeded\n", "workdir/setup.sh ran"
        assert "setup.sh" not in solved.files, "and removed itself"
        assert solved.artifacts["/app/greet.sh"].startswith('#!/bin/bash\necho "Hello, $1!"')
    if name == "mcp-codes":
        assert [(s.name, s.transport) for s in request.mcp_servers] == [("codes", "stdio")]
    if name == "mcp-sidecar":
        assert [(s.name, s.url) for s in request.mcp_servers] == [("mcp-server", "http://mcp-server:8000/mcp")]
    if name == "hello-app":
        assert request.workdir == "/app"
        assert solved.files == {"greeting.txt": "Good morning, harbor.\n"}


@pytest.mark.timeout(600)
async def test_an_entrypoint_that_fails_stops_setup_with_its_output(backend: LocalBackend) -> None:
    failing = entrypoint_command(["/bin/sh", "-c", "echo cannot write /etc/hosts >&2; exit 3", "entrypoint"])
    request = RolloutRequest(instruction="x", setup=[failing], solution=[], verify=["true"])
    result = await run_rollout(request, backend)
    assert (result.status, result.failed_phase) == ("setup_failed", "setup")
    assert "the image's ENTRYPOINT exited 3: cannot write /etc/hosts" in (result.error or ""), result.error


@pytest.mark.timeout(600)
async def test_a_foreground_entrypoint_outlives_setup(backend: LocalBackend) -> None:
    """An ENTRYPOINT that never execs its command (a server in the foreground) is waited for a bounded while, then
    left running: the solution and verify still reach it."""
    server = "cd /tmp && echo served > page && exec python3 -m http.server 8081 --bind 127.0.0.1"
    request = RolloutRequest(
        instruction="x",
        setup=[entrypoint_command(["/bin/sh", "-c", server, "entrypoint"])],
        solution=["curl -sf --noproxy '*' http://127.0.0.1:8081/page > got.txt"],
        verify=['test "$(cat /home/user/workdir/got.txt)" = served'],
        verify_sandbox="same",
    )
    result = await run_rollout(request, backend)
    assert (result.status, result.reward) == ("completed", 1.0), (result.error, result.solution_results)
