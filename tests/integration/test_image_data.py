"""The host reads a task's image and its task dir as data: a FIFO where a regular file must be (the image's
/etc/passwd, a task file, a build context's file) is an error naming it, never an open that blocks a host thread;
hostile images cost their own rollouts an error and a healthy rollout beside them completes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.build.builder import ImageBuilder, ImageBuildError, context_hash
from opencode_env.sandbox.local.images.store import ImageRefused, ImageStore
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.tasks import HarborTask, TaskFormatError
from tests.integration.test_images import busybox_image  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(900)
HOSTILE_ROLLOUTS = 8
"""More than the default thread pool's workers on this 2-core machine (min(32, cpus + 4) = 6)."""
DEADLINE_S = 300.0
HEALTHY_AGENT_S = 600.0
"""The healthy rollout's own budget: this 2-core machine is shared with other test runs (load ~30 at times)."""


@pytest.fixture(scope="module")
def fifo_image(busybox_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    """A real image, built in the build box, whose /etc/passwd is a FIFO."""
    context = tmp_path_factory.mktemp("fifo-passwd") / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {busybox_image}\nRUN busybox mkfifo /etc/passwd\n")
    ref = ImageBuilder().build(context, name=f"fifo-passwd-{os.getpid()}", timeout_s=600).ref
    yield ref
    subprocess.run(["podman", "rmi", "--force", "--", ref], check=False, capture_output=True)


def _within_deadline(call: object) -> BaseException | None:
    """What `call` raised, run in a thread that must give its worker back before the deadline."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()  # type: ignore[operator]
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the host's thread is still blocked on the image's file"
    return outcome[0]


def test_a_fifo_at_the_images_etc_passwd_is_an_error_naming_it(fifo_image: str, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    raised = _within_deadline(lambda: store.prepare(fifo_image))
    assert isinstance(raised, ImageRefused), raised
    assert "/etc/passwd is a FIFO, not a regular file" in str(raised)
    assert fifo_image in str(raised)
    again = _within_deadline(lambda: store.prepare(fifo_image))
    assert isinstance(again, ImageRefused), "the verdict is kept: the image is not copied again"
    assert not any(path.name == "rootfs" for path in (tmp_path / "images").rglob("*"))


async def test_hostile_image_rollouts_fail_alone_and_a_healthy_rollout_beside_them_completes(
    backend: LocalBackend, fifo_image: str
) -> None:
    with ScriptedModelServer(demo_script()) as model:
        healthy = run_rollout(demo_request(model.base_url, agent_timeout_s=HEALTHY_AGENT_S), backend)
        on_fifo = demo_request(model.base_url, image=fifo_image)
        hostile = [run_rollout(on_fifo, backend) for _ in range(HOSTILE_ROLLOUTS)]
        results = await asyncio.wait_for(asyncio.gather(healthy, *hostile), timeout=DEADLINE_S + HEALTHY_AGENT_S)
    assert results[0].status == "completed", results[0].error
    assert results[0].reward == 1.0
    for result in results[1:]:
        assert result.status == "sandbox_error"
        assert "/etc/passwd is a FIFO" in (result.error or "")


def _task(root: Path) -> Path:
    task = root / "task"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "instruction.md").write_text("do it\n")
    (task / "tests" / "test.sh").write_text("exit 0\n")
    (task / "environment" / "Dockerfile").write_text("FROM scratch\n")
    return task


@pytest.mark.parametrize("planted", ["instruction.md", "task.toml", "tests/helper.py", "environment/data.bin"])
def test_a_fifo_in_a_task_dir_is_refused_by_name_without_blocking(tmp_path: Path, planted: str) -> None:
    task = _task(tmp_path)
    (task / planted).unlink(missing_ok=True)
    os.mkfifo(task / planted)
    raised = _within_deadline(lambda: HarborTask.from_dir(task))
    assert isinstance(raised, TaskFormatError), raised
    assert f"{planted}: not a regular file" in str(raised)


def test_a_fifo_in_a_build_context_fails_the_build_by_name(tmp_path: Path) -> None:
    context = _task(tmp_path) / "environment"
    os.mkfifo(context / "pipe")
    raised = _within_deadline(lambda: context_hash(context))
    assert isinstance(raised, ImageBuildError), raised
    assert "environment/pipe: not a regular file" in str(raised)
