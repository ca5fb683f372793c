"""The contract every sandbox backend meets; parametrized over backends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import cast

import pytest

from opencode_env.sandbox import make_backend
from opencode_env.sandbox.base import (
    HOME,
    WORKDIR,
    CarryLimits,
    ProvidedTools,
    RolloutSandbox,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
)
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.grader_python import GRADER_PYTHON_DIR
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.store import HOST_IMAGE
from tests.conftest import processes_mentioning
from tests.helpers import sleep_cmd


@pytest.fixture(
    params=[
        "local",
        "e2b-fake",
        pytest.param("e2b-live", marks=pytest.mark.e2b),
        "hf-fake",
        pytest.param("hf-live", marks=pytest.mark.hf),
    ]
)
def any_backend(request: pytest.FixtureRequest, backend: LocalBackend, e2b_fake: E2BBackend) -> SandboxBackend:
    if request.param == "local":
        return backend
    if request.param == "e2b-fake":
        return e2b_fake
    if request.param == "hf-fake":
        return request.getfixturevalue("hf_fake")  # type: ignore[no-any-return]
    if request.param == "hf-live":
        return make_backend("hf")
    return make_backend("e2b")


@pytest.fixture
async def sandbox(any_backend: SandboxBackend, no_leaks: None) -> AsyncIterator[Sandbox]:
    box = await any_backend.create(SandboxSpec(task_id="contract", env={"TASK_FLAG": "on"}))
    try:
        yield box
    finally:
        await box.close()


async def test_exit_codes_and_output(sandbox: Sandbox) -> None:
    ok = await sandbox.run("echo out; echo err >&2", timeout_s=10)
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.timed_out) == (0, "out\n", "err\n", False)
    failed = await sandbox.run("exit 7", timeout_s=10)
    assert failed.exit_code == 7


async def test_default_cwd_is_the_workdir_and_home_is_fixed(sandbox: Sandbox) -> None:
    result = await sandbox.run("pwd; echo $HOME; ls -d /home/user/logs/verifier", timeout_s=10)
    assert result.stdout.split() == [WORKDIR, HOME, "/home/user/logs/verifier"]
    assert (await sandbox.run("pwd", timeout_s=10, cwd="/tmp")).stdout.strip() == "/tmp"


async def test_environment_is_an_allowlist(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVER_SECRET_KEY", "sk-server-only")
    result = await sandbox.run("env", timeout_s=10, env={"EXTRA": "1"})
    assert "sk-server-only" not in result.stdout
    assert "TASK_FLAG=on" in result.stdout
    assert "EXTRA=1" in result.stdout


async def test_timeout_kills_the_command_and_its_children(sandbox: Sandbox) -> None:
    result = await sandbox.run(f"{sleep_cmd(300)} & {sleep_cmd(301)}; echo never", timeout_s=0.5)
    assert result.timed_out
    assert result.exit_code is None
    assert "never" not in result.stdout
    await asyncio.sleep(0.2)
    assert processes_mentioning(sleep_cmd(300), sleep_cmd(301)) == []


async def test_background_process_runs_until_killed(sandbox: Sandbox) -> None:
    process = await sandbox.start(f"echo started; exec {sleep_cmd(300)}", log_path="/home/user/logs/bg.log")
    for _ in range(200):
        with contextlib.suppress(FileNotFoundError):
            if b"started" in await sandbox.read_file("/home/user/logs/bg.log"):
                break
        await asyncio.sleep(0.02)
    assert await process.running()
    await process.kill()
    assert not await process.running()


async def test_files_round_trip_text_and_binary(sandbox: Sandbox) -> None:
    await sandbox.write_file(f"{WORKDIR}/sub/note.txt", "héllo\n")
    await sandbox.write_file("/tmp/blob.bin", bytes(range(256)))
    assert await sandbox.read_file(f"{WORKDIR}/sub/note.txt") == "héllo\n".encode()
    assert await sandbox.read_file("/tmp/blob.bin") == bytes(range(256))
    assert (await sandbox.run("cat sub/note.txt && wc -c < /tmp/blob.bin", timeout_s=10)).stdout == "héllo\n256\n"
    entries = await sandbox.list_files(WORKDIR, limit=10)
    assert [(e.path, e.size) for e in entries] == [("sub/note.txt", 7)]
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file(f"{WORKDIR}/missing.txt")


async def test_local_files_outside_the_sandbox_are_refused(backend: LocalBackend, no_leaks: None) -> None:
    """On the host's root (an image's root is the rollout's own: tests/test_images.py)."""
    sandbox = await backend.create(SandboxSpec(image=HOST_IMAGE))
    try:
        await _refuses_outside_writes(sandbox)
    finally:
        await sandbox.close()


async def _refuses_outside_writes(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError, match="outside"):
        await sandbox.write_file("/etc/evil", "x")
    with pytest.raises(SandboxError, match="outside"):
        await sandbox.write_file(f"{WORKDIR}/../../../etc/evil", "x")


HOST_HOME = os.path.expanduser("~")


async def test_host_home_and_tmp_are_hidden(sandbox: Sandbox) -> None:
    host_home = HOST_HOME
    result = await sandbox.run(f"ls -A {host_home} /tmp | head -50", timeout_s=10)
    assert ".bash_history" not in result.stdout
    assert "pytest-of" not in result.stdout


async def test_close_kills_everything_and_is_idempotent(any_backend: SandboxBackend, no_leaks: None) -> None:
    box = await any_backend.create(SandboxSpec())
    await box.start(f"exec {sleep_cmd(400)}", log_path="/home/user/logs/a.log")
    running = asyncio.ensure_future(box.run(sleep_cmd(401), timeout_s=60))
    await asyncio.sleep(0.3)
    await box.close()
    await box.close()
    result = await running
    assert result.exit_code != 0
    assert processes_mentioning(sleep_cmd(400), sleep_cmd(401)) == []
    with pytest.raises(SandboxError, match="closed"):
        await box.run("true", timeout_s=5)


@pytest.mark.parametrize("place", ["/tmp", os.path.expanduser("~"), "/"])
async def test_tools_anywhere_on_the_host_stay_visible(place: str, sandbox_base: Path, no_leaks: None) -> None:
    """A checkout or cache under /tmp, a home directory or a 0700 directory of the operator's (CI clones, the Space
    image, `mktemp -d`) still runs inside."""
    locked = Path(tempfile.mkdtemp(prefix="opencode-env-checkout-", dir=place))
    try:
        tool_home = locked / "toolenv"
        (tool_home / "bin").mkdir(parents=True)
        tool = tool_home / "bin" / "python"
        tool.write_text("#!/bin/sh\necho tool-ran\n")
        tool.chmod(0o755)
        tools = ProvidedTools(python=str(tool))

        async def resolver() -> ProvidedTools:
            return tools

        box = await LocalBackend(resolver, base_dir=sandbox_base).create(SandboxSpec(image=HOST_IMAGE))
        try:
            result = await box.run(str(tool), timeout_s=10)
            assert (result.exit_code, result.stdout) == (0, "tool-ran\n")
            assert (await box.run("echo ok > /tmp/scratch && cat /tmp/scratch", timeout_s=10)).stdout == "ok\n"
        finally:
            await box.close()
    finally:
        shutil.rmtree(locked)


async def test_close_all_closes_what_is_still_open(any_backend: SandboxBackend, no_leaks: None) -> None:
    closed_early = await any_backend.create(SandboxSpec())
    left_open = [await any_backend.create(SandboxSpec()) for _ in range(2)]
    await left_open[0].start(f"exec {sleep_cmd(402)}", log_path="/home/user/logs/a.log")
    await closed_early.close()
    assert await any_backend.close_all() == 2
    assert await any_backend.close_all() == 0
    assert processes_mentioning(sleep_cmd(402)) == []
    with pytest.raises(SandboxError, match="closed"):
        await left_open[1].run("true", timeout_s=5)


async def test_close_finishes_even_when_its_caller_is_cancelled(any_backend: SandboxBackend, no_leaks: None) -> None:
    box = await any_backend.create(SandboxSpec())
    await box.start(f"exec {sleep_cmd(403)}", log_path="/home/user/logs/a.log")
    closing = asyncio.ensure_future(box.close())
    await asyncio.sleep(0)
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await box.close()
    assert processes_mentioning(sleep_cmd(403)) == []


async def test_verify_runs_as_the_grader_over_the_handed_work_and_the_protected_files(sandbox: Sandbox) -> None:
    """Every backend: links the agent left in the way of the protected files and the verifier directory are no
    obstacle and lead nowhere; the grader is another identity with a fresh HOME of its own, holding only our Python
    start-up directory."""
    plant = (
        "echo work > workdir/mine.txt && rm -rf logs/verifier && ln -s /tmp logs/verifier && ln -s /etc workdir/tests"
    )
    assert (await sandbox.run(plant, timeout_s=10, cwd=HOME)).exit_code == 0
    await sandbox.hand_to_grader({"tests/test_it.py": "protected\n"})
    graded = await sandbox.run(
        "id -un; echo $HOME; ls -A $HOME; cat tests/test_it.py mine.txt; "
        "echo 0.5 > /home/user/logs/verifier/reward.txt && echo wrote",
        timeout_s=10,
        identity="grader",
    )
    name, home, *rest = graded.stdout.split()
    assert (name, home != HOME) == ("grader", True), graded.stderr
    assert rest == [PurePosixPath(GRADER_PYTHON_DIR).name, "protected", "work", "wrote"], graded.stdout + graded.stderr
    assert await sandbox.read_file(f"{HOME}/logs/verifier/reward.txt") == b"0.5\n"
    assert await sandbox.read_file(f"{WORKDIR}/tests/test_it.py") == b"protected\n"


async def test_the_work_dir_crosses_into_another_sandbox_as_regular_files_only(
    sandbox: Sandbox, any_backend: SandboxBackend
) -> None:
    """Every backend: the agent's work dir copied into a second sandbox of its own kind (the grader's box) holds its
    regular files and directories, modes normalised, and nothing of its links, FIFOs or metadata; what the second
    one held in its work dir before is gone but its own metadata."""
    plant = (
        "mkdir -p workdir/pkg && echo 'x = 1' > workdir/pkg/mod.py && chmod 4700 workdir/pkg/mod.py "
        "&& ln -s /etc/passwd workdir/link && mkfifo workdir/pipe && mkdir workdir/Evil.DIST-INFO"
    )
    assert (await sandbox.run(plant, timeout_s=10, cwd=HOME)).exit_code == 0
    grader = await any_backend.create(SandboxSpec(task_id="contract"))
    try:
        prepared = "mkdir -p workdir/.git && echo setup > workdir/.git/HEAD && echo stale > workdir/stale.txt"
        assert (await grader.run(prepared, timeout_s=10, cwd=HOME)).exit_code == 0
        report = await cast(RolloutSandbox, sandbox).carry_workdir_to(grader, keep=(), limits=CarryLimits())
        listed = await grader.run("find . -printf '%y %m %p\\n'", timeout_s=10, cwd=WORKDIR)
    finally:
        await grader.close()
    assert sorted(listed.stdout.split("\n")[:-1]) == [
        "d 755 .",
        "d 755 ./.git",
        "d 755 ./pkg",
        "f 644 ./.git/HEAD",
        "f 755 ./pkg/mod.py",
    ], listed.stdout
    assert {(item.path, item.kind) for item in report.skipped} >= {
        ("link", "symlink"),
        ("pipe", "fifo"),
        ("Evil.DIST-INFO", "metadata"),
    }
    assert report.over == ""


async def test_what_setup_made_in_both_boxes_is_no_finding_and_a_changed_git_is_one(
    sandbox: Sandbox, any_backend: SandboxBackend
) -> None:
    """Every backend reports alike (the cloud's from the grader box's survey, the local from its tree): setup's own
    `.git`, bytecode and links, present in both boxes, are no finding; the agent's changed `.git` config is one, and
    the grader keeps its own."""
    setup = (
        "mkdir -p workdir/.git/hooks workdir/pkg/__pycache__ && printf '[core]\\n' > workdir/.git/config "
        "&& echo x > workdir/pkg/__pycache__/mod.pyc && ln -s pkg workdir/alias && echo 'x = 1' > workdir/pkg/mod.py"
    )
    assert (await sandbox.run(setup, timeout_s=10, cwd=HOME)).exit_code == 0
    grader = await any_backend.create(SandboxSpec(task_id="contract"))
    try:
        assert (await grader.run(setup, timeout_s=10, cwd=HOME)).exit_code == 0
        agent = cast(RolloutSandbox, sandbox)
        alike = await agent.carry_workdir_to(grader, keep=(), limits=CarryLimits())
        hostile = "printf '[core]\\n\\tfsmonitor = touch /tmp/owned\\n' > workdir/.git/config"
        assert (await sandbox.run(hostile, timeout_s=10, cwd=HOME, identity="root")).exit_code == 0
        changed = await agent.carry_workdir_to(grader, keep=(), limits=CarryLimits())
        config = await grader.read_file(f"{WORKDIR}/.git/config")
    finally:
        await grader.close()
    assert (alike.skipped, alike.files) == ([], 1)
    assert [(item.path, item.kind) for item in changed.skipped] == [(".git", "changed_git")]
    assert config == b"[core]\n"
