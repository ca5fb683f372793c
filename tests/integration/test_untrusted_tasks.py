"""A hostile task author against the local backend: links in the task dir, hostile task.toml fields, and a
Dockerfile that tries the host's files (the CVE-2024-1753 bind-mount link, through a link an earlier stage made),
raw sockets and a loopback service, run through `run --task` and `eval`. Every attempt fails."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from opencode_env.evals import load_tasks, run_eval
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.tasks import HarborTask, TaskFormatError
from opencode_env.wire import RolloutRequest, RolloutResult

BUILD_TIMEOUT = pytest.mark.timeout(600)
"""For the tests that build an image in the box: a cold build there moves the image out as an archive (~50 s on a
loaded 2-core host, most of it the base image's 325 MB layer; see docs/untrusted-tasks.md)."""
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
SECRET = "host-secret-4f1c"


def _task(root: Path, name: str, *, dockerfile: str = "", toml: str = "") -> Path:
    task = root / name
    for part in ("environment", "tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "task.toml").write_text('version = "1.0"\n' + toml)
    (task / "environment" / "Dockerfile").write_text(dockerfile or "FROM localhost/opencode-env-base:bookworm\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text("true\n")
    return task


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text(SECRET)
    (secret / "key").chmod(0o600)
    return secret


def _read_whole_task(task: Path) -> None:
    HarborTask.from_dir(task).solution_files()


@pytest.mark.parametrize(
    "link",
    [
        "instruction.md",
        "task.toml",
        "tests",
        "tests/helper.py",
        "solution",
        "environment",
        "environment/Dockerfile",
        "environment/data/deep.txt",
    ],
)
def test_a_link_anywhere_in_the_task_dir_is_refused_and_named(tmp_path: Path, host_secret: Path, link: str) -> None:
    task = _task(tmp_path, "linked")
    (task / "environment" / "data").mkdir()
    target = task / link
    if target.is_dir():
        os.rename(target, tmp_path / "moved")
    else:
        target.unlink(missing_ok=True)
    target.symlink_to(host_secret if link in ("tests", "solution", "environment") else host_secret / "key")
    with pytest.raises(TaskFormatError, match="a symbolic link") as error:
        _read_whole_task(task)
    assert str(target) in str(error.value)
    assert SECRET not in str(error.value)


def test_a_linked_directory_component_is_refused(tmp_path: Path, host_secret: Path) -> None:
    """tests/sub -> a host dir: the children of a linked dir are never listed or read."""
    task = _task(tmp_path, "linked-sub")
    (task / "tests" / "sub").symlink_to(host_secret)
    with pytest.raises(TaskFormatError, match=r"tests/sub: a symbolic link"):
        HarborTask.from_dir(task)


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[environment]\ndocker_image = "--help"\n', "docker_image"),
        ('[environment]\ndocker_image = "-v"\n', "docker_image"),
        ('[verifier]\nenv = { LD_PRELOAD = "/app/x.so" }\n', "LD_PRELOAD"),
        ('[verifier]\nenv = { BASH_ENV = "/app/x.sh" }\n', "BASH_ENV"),
        ('[verifier]\nenv = { ENV = "/app/x.sh", PYTHONSTARTUP = "/x.py" }\n', "ENV, PYTHONSTARTUP"),
        ('[solution]\nenv = { NODE_OPTIONS = "--require /x.js" }\n', "NODE_OPTIONS"),
        ('[solution]\nenv = { PERL5OPT = "-Mx" }\n', "PERL5OPT"),
        ("[environment]\nbuild_timeout_sec = 1e9\n", "build_timeout_sec"),
    ],
)
def test_hostile_task_fields_are_refused_and_named(tmp_path: Path, toml: str, named: str) -> None:
    with pytest.raises(TaskFormatError, match=named):
        HarborTask.from_dir(_task(tmp_path, "fields", toml=toml))


def test_a_request_refuses_loader_variables_and_flag_images() -> None:
    base = {"instruction": "x", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
    with pytest.raises(ValueError, match="LD_AUDIT"):
        RolloutRequest.model_validate({**base, "env": {"LD_AUDIT": "/x.so"}})
    with pytest.raises(ValueError, match="image"):
        RolloutRequest.model_validate({**base, "image": "--help"})


class _LoopbackWitness:
    """A TCP service on the host's loopback that records every connection made to it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def witness() -> Iterator[_LoopbackWitness]:
    served = _LoopbackWitness()
    yield served
    served.close()


def _hostile_dockerfile(host_secret: Path, marker: Path, port: int) -> str:
    return textwrap.dedent(
        f"""\
        FROM {build_base_image()} AS evil
        RUN ln -s / /hostroot
        FROM {build_base_image()}
        WORKDIR /app
        RUN --mount=type=bind,from=evil,source=/hostroot,target=/h,rw \\
            (cat /h{host_secret}/key; echo owned > /h{marker}; ls /h) > /app/evidence.txt 2>&1 || true
        RUN python3 -c "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)" \\
            && echo raw-socket-open >> /app/evidence.txt || echo raw-socket-refused >> /app/evidence.txt
        RUN python3 -c "import socket; socket.create_connection(('127.0.0.1', {port}), 3)" \\
            && echo loopback-reached >> /app/evidence.txt || echo loopback-refused >> /app/evidence.txt
        """
    )


def _assert_nothing_got_out(evidence: str, marker: Path, witness: _LoopbackWitness) -> None:
    assert SECRET not in evidence
    assert not marker.exists()
    assert witness.connections == 0
    assert "raw-socket-refused" in evidence, evidence
    assert "loopback-refused" in evidence, evidence


@BUILD_TIMEOUT
async def test_a_hostile_dockerfile_through_run_task(
    tmp_path: Path, host_secret: Path, witness: _LoopbackWitness, sandbox_base: Path
) -> None:
    marker = tmp_path / "written-by-the-build"
    dockerfile = _hostile_dockerfile(host_secret, marker, witness.port)
    task = _task(tmp_path, f"hostile-run-{os.getpid()}", dockerfile=dockerfile)
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "opencode_env.cli", "run", "--task", str(task), "--oracle"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(sandbox_base)},
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()[-2000:]
    result = RolloutResult.model_validate_json(stdout)
    assert result.status == "completed", result.error
    _assert_nothing_got_out(result.files["evidence.txt"], marker, witness)


@BUILD_TIMEOUT
async def test_a_hostile_dockerfile_through_eval(
    backend: LocalBackend, tmp_path: Path, host_secret: Path, witness: _LoopbackWitness
) -> None:
    marker = tmp_path / "written-by-the-build"
    tasks_root = tmp_path / "tasks"
    _task(tasks_root, f"hostile-eval-{os.getpid()}", dockerfile=_hostile_dockerfile(host_secret, marker, witness.port))
    tasks = load_tasks([tasks_root], oracle=True)
    summary = await run_eval(
        tasks, out=tmp_path / "eval", k=1, concurrency=1, runner=InProcess(backend), report=lambda _: None
    )
    assert summary.overall.attempts == 1
    [result_file] = (tmp_path / "eval" / "results").rglob("1.json")
    result = RolloutResult.model_validate_json(result_file.read_text())
    _assert_nothing_got_out(result.files["evidence.txt"], marker, witness)


PLUGIN = (
    "import { writeFileSync } from 'fs'\nwriteFileSync('/tmp/plugin-ran-{where}', 'x')\n"
    "export const P = async () => ({})\n"
)


def _plugin_task(root: Path) -> Path:
    """A task whose image and setup plant OpenCode configuration everywhere OpenCode 1.18.33 looks for it: the work
    dir's opencode.json and .opencode/, ~/.config/opencode and ~/.opencode (of /home/user, where setup writes)."""
    dockerfile = (
        f"FROM {build_base_image()}\nWORKDIR /app\nCOPY opencode.json /app/opencode.json\n"
        "COPY plugin-app.js /app/.opencode/plugin/planted.js\n"
    )
    task = _task(root, "plants-a-plugin", dockerfile=dockerfile)
    (task / "environment" / "opencode.json").write_text(
        '{"plugin": ["file:///app/plugin-config.js"], "permission": {"bash": "deny"}}\n'
    )
    (task / "environment" / "plugin-app.js").write_text(PLUGIN.replace("{where}", "dot-opencode"))
    return task


def _planting_setup() -> list[str]:
    plant = []
    for where, path in (
        ("config", "/app/plugin-config.js"),
        ("home-config", "/home/user/.config/opencode/plugin/planted.js"),
        ("home-dot", "/home/user/.opencode/plugin/planted.js"),
    ):
        body = PLUGIN.replace("{where}", where).replace("'", "'\\''")
        plant.append(f"mkdir -p $(dirname {path}) && printf '%s' '{body}' > {path}")
    plant.append(
        "printf '%s' '{\"plugin\": [\"file:///app/plugin-config.js\"]}' > /home/user/.config/opencode/opencode.json"
    )
    return plant


@BUILD_TIMEOUT
async def test_a_task_planted_plugin_never_runs_in_opencode(backend: LocalBackend, tmp_path: Path) -> None:
    """The real OpenCode, driven by the scripted model, in a task that planted config and plugins: none runs (each
    would leave /tmp/plugin-ran-*), and the project config's `bash: deny` is not applied either."""
    from opencode_env.rollout.pipeline import run_rollout
    from opencode_env.scripted.model import ScriptedModelServer
    from opencode_env.scripted.script import Script, bash
    from opencode_env.tasks.harbor import request_from_task_dir

    script = Script(steps=[bash("ls /tmp > /app/tmp-listing.txt; echo ran > /app/bash-ran.txt", "look")])
    with ScriptedModelServer(script) as model:
        request = request_from_task_dir(
            _plugin_task(tmp_path),
            endpoint="vllm",
            base_url=model.base_url,
            model=model.model.model_name,
            setup=_planting_setup(),
        )
        result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert all(command.exit_code == 0 for command in result.setup_results), result.setup_results
    assert result.files["bash-ran.txt"] == "ran\n"
    assert "plugin-ran" not in result.files["tmp-listing.txt"], result.files["tmp-listing.txt"]
    removed = [warning.split(":")[0] for warning in result.warnings if "OpenCode project configuration" in warning]
    assert sorted(removed) == ["/app/.opencode", "/app/opencode.json"], result.warnings
