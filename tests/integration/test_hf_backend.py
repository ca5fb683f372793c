"""The Hugging Face backend over the fake (real local processes, the SDK's own exception types), and live when
possible. The backend contract suite runs on it too (tests/test_sandbox_contract.py)."""

from __future__ import annotations

import gc
import inspect
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import HfApi, Sandbox
from huggingface_hub._sandbox import SandboxFiles, SandboxProcess
from pydantic import ValidationError

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import make_backend, resolve_backend_name
from opencode_env.sandbox.base import SandboxError, SandboxSpec
from opencode_env.sandbox.cloud.hf import HFBackend, HFSandbox, default_image, reap
from opencode_env.sandbox.cloud.hf_shell import parse_listing, parse_probe
from opencode_env.scripted.demo import demo_request
from opencode_env.settings import Settings
from opencode_env.testing.fake_hf import (
    FAKE_TOOLS_DIR,
    FakeHfApi,
    FakeHfCloud,
    FakeSandbox,
    FakeSandboxFiles,
    FakeSandboxProcess,
)
from tests.conftest import processes_mentioning
from tests.helpers import idle_model_url, sleep_cmd


def parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(name, p.default) for name, p in inspect.signature(function).parameters.items() if name != "self"]


@pytest.mark.parametrize(
    ("real", "fake"),
    [
        (Sandbox.create, FakeSandbox.create),
        (Sandbox.run, FakeSandbox.run),
        (Sandbox.processes, FakeSandbox.processes),
        (Sandbox._kill, FakeSandbox._kill),
        (SandboxProcess.kill, FakeSandboxProcess.kill),
        (SandboxFiles.write, FakeSandboxFiles.write),
        (SandboxFiles.read, FakeSandboxFiles.read),
        (HfApi.list_jobs, FakeHfApi.list_jobs),
        (HfApi.cancel_job, FakeHfApi.cancel_job),
    ],
)
def test_the_fake_has_the_sdks_signatures(real: Callable[..., Any], fake: Callable[..., Any]) -> None:
    assert parameters(fake) == parameters(real)


def test_the_fake_process_has_the_sdks_fields() -> None:
    assert list(inspect.signature(FakeSandboxProcess).parameters) == list(inspect.signature(SandboxProcess).parameters)


@pytest.fixture
def hf_no_leaks(hf_cloud: FakeHfCloud, sandbox_base: Path) -> Iterator[None]:
    yield
    assert hf_cloud.alive == {}
    assert list(sandbox_base.iterdir()) == []
    assert processes_mentioning(str(sandbox_base)) == []


async def test_task_commands_run_as_user_and_privileged_ones_as_root(hf_fake: HFBackend, hf_no_leaks: None) -> None:
    box = await hf_fake.create(SandboxSpec())
    try:
        assert isinstance(box, HFSandbox)
        as_user = await box.run("id -un; env", timeout_s=10)
        as_root = await box.run("id -un", timeout_s=10, identity="root")
        as_grader = await box.run("id -un; echo $HOME; grep CapEff /proc/self/status", timeout_s=10, identity="grader")
        assert as_user.stdout.splitlines()[0] == "user"
        assert as_root.stdout.strip() == "root"
        assert as_grader.stdout.split() == ["grader", "/home/grader/home", "CapEff:", "0000000000000000"]
        assert "SBX_" not in as_user.stdout
        assert "HOME=/home/user" in as_user.stdout
    finally:
        await box.close()


async def test_the_sandbox_servers_variables_never_reach_a_command(hf_cloud: FakeHfCloud, hf_no_leaks: None) -> None:
    backend = HFBackend(
        sandbox_class=hf_cloud.sandbox_class(), token=hf_cloud.token, image="opencode-env", tools_dir=FAKE_TOOLS_DIR
    )
    box = await backend.create(SandboxSpec())
    try:
        assert isinstance(box, HFSandbox)
        result = await box.run("env", timeout_s=10, env={"SBX_TOKEN": "sbx-secret", "SBX_PORT": "49983"})
        assert "sbx-secret" not in result.stdout
        assert "SBX_PORT" not in result.stdout
    finally:
        await box.close()


@pytest.mark.timeout(600)
async def test_an_image_without_opencode_gets_its_binary_at_creation(hf_cloud: FakeHfCloud, hf_no_leaks: None) -> None:
    backend = HFBackend(
        sandbox_class=hf_cloud.sandbox_class(), token=hf_cloud.token, image="python:3.12", tools_dir="/tmp/oce"
    )
    started = time.monotonic()
    box = await backend.create(SandboxSpec())
    try:
        print(f"creation with the OpenCode download: {time.monotonic() - started:.1f} s")
        assert box.tools.opencode_version == "1.18.33"
        version = await box.run("opencode --version; command -v opencode", timeout_s=60)
        assert version.stdout.splitlines() == ["1.18.33", "/tmp/oce/bin/opencode"]
    finally:
        await box.close()


@pytest.mark.parametrize(
    ("cloud_change", "token", "image", "expected"),
    [
        ({}, "", "opencode-env", "HF_TOKEN is not set"),
        ({}, "hf_wrong", "opencode-env", "rejected the token"),
        ({"payment_required": True}, None, "opencode-env", "HTTP 402"),
        ({"max_jobs": 0}, None, "opencode-env", "rate limit"),
        ({}, None, "no-such-image", "did not start"),
        ({"unreachable": True}, None, "opencode-env", "unreachable"),
    ],
)
async def test_each_creation_failure_is_one_clear_fast_error(
    sandbox_base: Path,
    cloud_change: dict[str, Any],
    token: str | None,
    image: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    hf_no_leaks: None,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    cloud = FakeHfCloud(base_dir=sandbox_base, **cloud_change)
    backend = HFBackend(
        sandbox_class=cloud.sandbox_class(),
        token=cloud.token if token is None else token,
        image=image,
        tools_dir=FAKE_TOOLS_DIR,
    )
    started = time.monotonic()
    result = await run_rollout(demo_request(idle_model_url()), backend)
    elapsed = time.monotonic() - started
    assert (result.status, result.failed_phase) == ("sandbox_error", "sandbox")
    assert expected in (result.error or "")
    assert cloud.alive == {}
    print(f"{expected!r}: failed in {elapsed * 1000:.0f} ms")


async def test_an_image_whose_server_is_not_root_is_refused_with_the_reason(
    sandbox_base: Path, hf_no_leaks: None
) -> None:
    cloud = FakeHfCloud(base_dir=sandbox_base, images={"with-user": True}, user_images={"with-user"})
    backend = HFBackend(sandbox_class=cloud.sandbox_class(), token=cloud.token, image="with-user")
    with pytest.raises(SandboxError, match="not root: use an image without USER"):
        await backend.create(SandboxSpec())
    assert cloud.alive == {}


def test_a_bad_cap_is_refused() -> None:
    with pytest.raises(ValidationError, match="OPENCODE_ENV_HF_MAX_SANDBOXES"):
        Settings.load({"OPENCODE_ENV_HF_MAX_SANDBOXES": "0"})
    with pytest.raises(ValueError, match="at least 1"):
        HFBackend(token="t", max_sandboxes=0)


async def test_reap_kills_tagged_sandboxes_left_behind(
    hf_cloud: FakeHfCloud, hf_fake: HFBackend, hf_no_leaks: None
) -> None:
    leaked = [await hf_fake.create(SandboxSpec(task_id=f"leak {i}")) for i in range(2)]
    await leaked[0].run(f"{sleep_cmd(310)} &", timeout_s=5)
    assert await reap(older_than_s=3600, api=hf_cloud.api()) == []
    killed = await reap(older_than_s=0, api=hf_cloud.api())
    assert sorted(killed) == sorted(box.sandbox_id for box in leaked)
    assert hf_cloud.alive == {}
    assert processes_mentioning(sleep_cmd(310)) == []
    for box in leaked:
        await box.close()


def test_listing_and_probe_parsing() -> None:
    assert [(e.path, e.size) for e in parse_listing("a b.txt\t7\0sub/c\t0\0")] == [("a b.txt", 7), ("sub/c", 0)]
    assert parse_listing("") == []
    assert parse_probe("1.18.33\nproxy-deps-ok\n") == ("1.18.33", True)
    assert parse_probe("bash: opencode: not found\n") == (None, False)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"E2B_API_KEY": "k", "SPACE_ID": "me/space"}, "e2b"),
        ({"SPACE_ID": "me/space"}, "hf"),
        ({"HF_TOKEN": "t", "OPENCODE_ENV_HF_SANDBOXES": "1"}, "hf"),
        ({"HF_TOKEN": "t"}, "local"),
        ({}, "local"),
    ],
)
def test_auto_picks_e2b_then_hf_then_local(env: dict[str, str], expected: str) -> None:
    assert resolve_backend_name("auto", Settings.load(env)) == expected


def test_the_default_image_is_the_spaces_own() -> None:
    assert default_image() == "python:3.12"
    assert default_image(space_id="me/opencode-env") == "hf.co/spaces/me/opencode-env"
    assert default_image("ghcr.io/me/opencode-env:1", "me/opencode-env") == "ghcr.io/me/opencode-env:1"


@pytest.mark.hf
@pytest.mark.timeout(900)
async def test_a_live_rollout_on_hf() -> None:
    endpoint = os.environ.get("OPENCODE_ENV_LIVE_ENDPOINT", "")
    if not endpoint:
        pytest.skip("set OPENCODE_ENV_LIVE_ENDPOINT (vllm, openai or hf_router, with its env vars) for a live rollout")
    result = await run_rollout(demo_request("", endpoint=endpoint, api_key="", model=""), make_backend("hf"))
    assert result.status == "completed", result.error


def test_a_fake_cloud_s_loop_ends_with_the_cloud(sandbox_base: Path) -> None:
    """Each fake cloud serves on a loop thread of its own; it ends once the cloud is gone, so a long test worker
    does not gather one thread per cloud it ever made."""

    async def serving() -> threading.Thread:
        return threading.current_thread()

    cloud = FakeHfCloud(base_dir=sandbox_base)
    thread = cloud.remote(serving())
    assert thread is not threading.current_thread()
    del cloud
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()
