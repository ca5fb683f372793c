"""Dockerfile instructions as Docker documents them, in the run as Harbor runs a task: a table of small
Dockerfiles (WORKDIR, ENV, ARG, ENTRYPOINT, CMD, USER in their common shapes), each built offline and run as a Harbor
task whose oracle prints what it sees; each row checks what Docker's reference says that shape does. Rows sharing a
Dockerfile share its build (the builder caches by content)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.tasks.harbor import request_from_task_dir

pytestmark = pytest.mark.timeout(900)

BASE = "localhost/opencode-env-base:bookworm"
SEES = """\
#!/bin/bash
echo "pwd=$(pwd)"
for name in A B C LEVEL ONLY_BUILD; do echo "$name=${!name-unset}"; done
echo "uid=$(id -u)"
echo "gid=$(id -g)"
echo "home=$HOME"
echo "built_by=$(cat /home/app/built-by 2>/dev/null || echo none)"
echo "entry_uid=$(cat /tmp/entry-uid 2>/dev/null || echo none)"
for path in /etc/started /etc/cmd-ran; do [ -e "$path" ] && echo "$path=yes" || echo "$path=no"; done
"""
VARIABLES = f"""\
ARG BASE={BASE}
FROM ${{BASE}}
ARG LEVEL=3
ARG ONLY_BUILD=x
ENV LEVEL=$LEVEL
ENV A=1 B="two words"
ENV C $A-x
ENV ROOT_DIR=/data
WORKDIR $ROOT_DIR/app
"""
NEVER_FILLED = f"FROM {BASE}\nWORKDIR /srv/deep/app\n"
START = f"""\
FROM {BASE}
WORKDIR /w
WORKDIR sub
ENTRYPOINT ["/bin/sh", "-c", "echo started > /etc/started; exec \\"$@\\"", "entrypoint"]
CMD ["/bin/sh", "-c", "echo ran > /etc/cmd-ran"]
"""
SHELL_FORM = f"FROM {BASE}\nENTRYPOINT echo started > /etc/started\nCMD touch /etc/cmd-ran\n"
USER = f"""\
FROM {BASE}
RUN useradd -u 1234 -m app
WORKDIR /app
USER app
RUN id -u > /home/app/built-by
ENTRYPOINT ["/bin/sh", "-c", "id -u > /tmp/entry-uid; exec \\"$@\\"", "entrypoint"]
"""
USER_IDS = f"FROM {BASE}\nUSER 4321:5\nWORKDIR /w\n"

ROWS = [
    pytest.param(NEVER_FILLED, {"pwd": "/srv/deep/app"}, id="WORKDIR absolute, nothing copied into it: made"),
    pytest.param(START, {"pwd": "/w/sub"}, id="WORKDIR relative: below the previous WORKDIR"),
    pytest.param(VARIABLES, {"pwd": "/data/app"}, id="WORKDIR with an ENV variable: substituted"),
    pytest.param(VARIABLES, {"A": "1", "B": "two words"}, id="ENV key=value pairs, quoted value"),
    pytest.param(VARIABLES, {"C": "1-x"}, id="ENV legacy form, an earlier variable substituted"),
    pytest.param(VARIABLES, {"LEVEL": "3"}, id="ARG before FROM names the base; a stage ARG carried by ENV"),
    pytest.param(VARIABLES, {"ONLY_BUILD": "unset"}, id="ARG alone is not in the running container's environment"),
    pytest.param(START, {"/etc/started": "yes"}, id="ENTRYPOINT exec form runs at start"),
    pytest.param(START, {"/etc/cmd-ran": "no"}, id="CMD is replaced by the runner's command"),
    pytest.param(SHELL_FORM, {"/etc/started": "yes", "/etc/cmd-ran": "no"}, id="ENTRYPOINT shell form ignores CMD"),
    pytest.param(
        USER, {"uid": "1234", "gid": "1234", "home": "/home/app", "pwd": "/app"}, id="USER name: its commands"
    ),
    pytest.param(USER, {"built_by": "1234"}, id="USER: later RUN lines run as that user"),
    pytest.param(USER, {"entry_uid": "1234"}, id="USER: the ENTRYPOINT runs as that user"),
    pytest.param(USER_IDS, {"uid": "4321", "gid": "5", "home": "/"}, id="USER uid:gid, no passwd entry: HOME /"),
    pytest.param(NEVER_FILLED, {"uid": "0"}, id="no USER: root"),
]


@pytest.fixture(scope="module", autouse=True)
def base_image() -> str:
    return build_base_image()


def _task(root: Path, dockerfile: str) -> Path:
    task = root / f"conformance-{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}"
    if task.is_dir():
        return task
    for part in ("environment", "tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[environment]\nmemory_mb = 1024\nstorage_mb = 1024\n')
    (task / "instruction.md").write_text("Print what you see.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text(SEES)
    return task


@pytest.fixture(scope="module")
def tasks_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conformance")


@pytest.mark.parametrize(("dockerfile", "expected"), ROWS)
async def test_an_instruction_does_what_docker_documents(
    backend: LocalBackend, tasks_root: Path, dockerfile: str, expected: dict[str, str]
) -> None:
    result = await run_rollout(request_from_task_dir(_task(tasks_root, dockerfile), oracle=True), backend)
    assert result.status == "completed", (result.error, result.setup_results)
    seen = dict(line.split("=", 1) for line in result.solution_results[0].stdout.splitlines())
    assert {key: seen.get(key) for key in expected} == expected
    assert result.identities["agent"] == ("image_user" if "\nUSER " in dockerfile else "root")
