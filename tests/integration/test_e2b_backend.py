"""The E2B backend over the fake (real local processes, the SDK's real exception types), and live when possible."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from e2b import AsyncSandbox
from e2b.sandbox_async.commands.command import Commands
from e2b.sandbox_async.commands.command_handle import AsyncCommandHandle
from e2b.sandbox_async.filesystem.filesystem import Filesystem

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import make_backend
from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.cloud.e2b import E2BBackend, reap
from opencode_env.sandbox.cloud.template import dockerfile
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, say, write
from opencode_env.testing.fake_e2b import (
    FakeAsyncSandbox,
    FakeCloud,
    FakeCommandHandle,
    FakeCommands,
    FakeFilesystem,
)
from tests.conftest import processes_mentioning
from tests.helpers import idle_model_url, sleep_cmd


def parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(name, p.default) for name, p in inspect.signature(function).parameters.items() if name != "self"]


@pytest.mark.parametrize(
    ("real", "fake"),
    [
        (AsyncSandbox.create, FakeAsyncSandbox.create),
        (AsyncSandbox.set_timeout, FakeAsyncSandbox.set_timeout),
        (AsyncSandbox.list, FakeAsyncSandbox.list),
        (AsyncSandbox._cls_kill, FakeAsyncSandbox.kill),
        (Commands.run, FakeCommands.run),
        (Commands.kill, FakeCommands.kill),
        (Filesystem.write, FakeFilesystem.write),
        (Filesystem.read, FakeFilesystem.read),
        (Filesystem.list, FakeFilesystem.list),
        (AsyncCommandHandle.wait, FakeCommandHandle.wait),
        (AsyncCommandHandle.kill, FakeCommandHandle.kill),
        (AsyncCommandHandle.disconnect, FakeCommandHandle.disconnect),
    ],
)
def test_the_fake_has_the_sdks_signatures(real: Callable[..., Any], fake: Callable[..., Any]) -> None:
    assert parameters(fake) == parameters(real)


@pytest.mark.timeout(300)
async def test_a_template_without_opencode_installs_it_at_run_time(fake_cloud: FakeCloud, no_leaks: None) -> None:
    backend = E2BBackend(sandbox_class=fake_cloud.sandbox_class(), api_key=fake_cloud.api_key)
    reports: list[tuple[str, str]] = []
    # The demo's solution without its bash check: the installed OpenCode writes it, verify grades it.
    script = Script(steps=[write("/home/user/workdir/add.py", "def add(a, b):\n    return a + b\n"), say("done")])
    with ScriptedModelServer(script) as model:
        result = await run_rollout(
            demo_request(model.base_url, template="base"),
            backend,
            progress=lambda phase, text: reports.append((phase, text)),
        )
    assert result.status == "completed", result.error
    assert result.opencode_version == "1.18.33"
    assert any("npm install" in text for phase, text in reports if phase == "install")
    assert result.reward == 1.0


@pytest.mark.parametrize(
    ("cloud_change", "key", "template", "expected"),
    [
        ({}, "", "", "E2B_API_KEY is not set"),
        ({}, "e2b_wrong", "", "rejected the API key"),
        ({"max_sandboxes": 0}, None, "", "rate limit"),
        ({}, None, "no-such-template", "build-template --name no-such-template"),
        ({"unreachable": True}, None, "", "unreachable"),
        ({"busy": True}, None, "", "busy"),
    ],
)
async def test_each_creation_failure_is_one_clear_fast_error(
    sandbox_base: Any,
    cloud_change: dict[str, Any],
    key: str | None,
    template: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    no_leaks: None,
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    cloud = FakeCloud(base_dir=sandbox_base, **cloud_change)
    backend = E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key if key is None else key)
    started = time.monotonic()
    result = await run_rollout(demo_request(idle_model_url(), template=template), backend)
    elapsed = time.monotonic() - started
    assert (result.status, result.failed_phase) == ("sandbox_error", "sandbox")
    assert expected in (result.error or "")
    assert cloud.alive == {}
    print(f"{expected!r}: failed in {elapsed * 1000:.0f} ms")


async def test_reap_kills_tagged_sandboxes_left_behind(
    fake_cloud: FakeCloud, e2b_fake: E2BBackend, no_leaks: None
) -> None:
    leaked = [await e2b_fake.create(SandboxSpec(task_id=f"leak{i}")) for i in range(2)]
    await leaked[0].run(f"{sleep_cmd(300)} &", timeout_s=5)
    killed = await reap(older_than_s=0, sandbox_class=fake_cloud.sandbox_class(), api_key=fake_cloud.api_key)
    assert sorted(killed) == sorted(box.sandbox_id for box in leaked)
    assert fake_cloud.alive == {}
    assert processes_mentioning(sleep_cmd(300)) == []
    for box in leaked:
        await box.close()


def test_the_template_bakes_in_opencode_and_the_proxy() -> None:
    text = dockerfile()
    assert "npm install -g opencode-ai@1.18.33" in text
    assert "pip install uvicorn uvloop httptools orjson" in text
    assert "@opencode-ai/plugin@1.18.33" in text
    assert "OPENCODE_DISABLE_MODELS_FETCH=1" in text
    assert "rm -f /etc/sudoers.d/user*" in text
    assert "OPENCODE_ENV_TEMPLATE_FORMAT=2" in text


@pytest.mark.e2b
@pytest.mark.timeout(900)
async def test_a_live_rollout_on_e2b() -> None:
    endpoint = os.environ.get("OPENCODE_ENV_LIVE_ENDPOINT", "")
    if not endpoint:
        pytest.skip("set OPENCODE_ENV_LIVE_ENDPOINT (vllm, openai or hf_router, with its env vars) for a live rollout")
    result = await run_rollout(demo_request("", endpoint=endpoint, api_key="", model=""), make_backend("e2b"))
    assert result.status == "completed", result.error


async def test_a_probe_that_fails_kills_the_sandbox_and_says_so(sandbox_base: Any, no_leaks: None) -> None:
    cloud = FakeCloud(base_dir=sandbox_base, command_failure=True)
    backend = E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key)
    result = await run_rollout(demo_request(idle_model_url()), backend)
    assert (result.status, result.failed_phase) == ("sandbox_error", "sandbox")
    assert "did not answer its first command" in (result.error or "")
    assert (cloud.created, cloud.alive) == (1, {})


async def test_a_rollout_cancelled_during_the_probe_kills_the_sandbox(sandbox_base: Any, no_leaks: None) -> None:
    cloud = FakeCloud(base_dir=sandbox_base, command_delay_s=5.0)
    backend = E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key)
    rollout = asyncio.ensure_future(run_rollout(demo_request(idle_model_url()), backend))
    for _ in range(200):
        if cloud.created:
            break
        await asyncio.sleep(0.05)
    rollout.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rollout
    assert (cloud.created, cloud.alive) == (1, {})


async def test_an_sdk_failure_mid_rollout_is_a_sandbox_error(sandbox_base: Any, no_leaks: None) -> None:
    cloud = FakeCloud(base_dir=sandbox_base)
    backend = E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key)

    def outage(phase: str, message: str) -> None:
        if phase == "setup":
            cloud.command_failure = True

    result = await run_rollout(demo_request(idle_model_url(), setup=["true"]), backend, progress=outage)
    assert result.status == "sandbox_error", result.error
    assert "running a command failed" in (result.error or "")
    assert result.reward is None
    assert cloud.alive == {}


async def test_a_template_built_by_an_older_version_is_refused_with_the_fix(sandbox_base: Any, no_leaks: None) -> None:
    cloud = FakeCloud(base_dir=sandbox_base, outdated_templates={"opencode-env"})
    backend = E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key)
    result = await run_rollout(demo_request(idle_model_url()), backend)
    assert (result.status, result.failed_phase) == ("sandbox_error", "sandbox")
    assert "rebuild the template" in (result.error or "")
    assert cloud.alive == {}
