"""What both cloud backends do the same way, over their fakes (real local processes, each SDK's own exception
types): a full rollout, where the caller's env reaches, a creation cancelled midway, the cap on sandboxes. Each
backend's own behaviour (its creation failures, its reaper, its image or template) stays in test_e2b_backend.py and
test_hf_backend.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend, SandboxSpec
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.cloud.hf import HFBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FAKE_TOOLS_DIR, FakeHfCloud
from opencode_env.wire import RolloutResult
from tests.helpers import idle_model_url
from tests.stub_server import wait_until


@dataclass(frozen=True)
class Provider:
    """One cloud's fake and how its backend is made over it."""

    name: str
    sandbox_id_prefix: str

    def cloud(self, base_dir: Path, **change: Any) -> FakeCloud | FakeHfCloud:
        return (
            FakeCloud(base_dir=base_dir, **change) if self.name == "e2b" else FakeHfCloud(base_dir=base_dir, **change)
        )

    def backend(self, cloud: FakeCloud | FakeHfCloud, **options: Any) -> SandboxBackend:
        if isinstance(cloud, FakeCloud):
            return E2BBackend(sandbox_class=cloud.sandbox_class(), api_key=cloud.api_key, **options)
        return HFBackend(
            sandbox_class=cloud.sandbox_class(),
            token=cloud.token,
            image="opencode-env",
            tools_dir=FAKE_TOOLS_DIR,
            **options,
        )


PROVIDERS = [Provider("e2b", "fake"), Provider("hf", "fakejob")]


@pytest.fixture(params=PROVIDERS, ids=[provider.name for provider in PROVIDERS])
def provider(request: pytest.FixtureRequest) -> Provider:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def shared_cloud(provider: Provider, fake_cloud: FakeCloud, hf_cloud: FakeHfCloud) -> FakeCloud | FakeHfCloud:
    """The session's fake of this provider (one per run: its sandboxes share the session's base directory)."""
    return fake_cloud if provider.name == "e2b" else hf_cloud


@dataclass(frozen=True)
class FullRollout:
    provider: Provider
    result: RolloutResult
    reports: list[tuple[str, str]]


CALLER_MARKER = "caller-preload-marker"


@pytest.fixture(scope="module", params=PROVIDERS, ids=[provider.name for provider in PROVIDERS])
async def full_rollout(
    request: pytest.FixtureRequest, fake_cloud: FakeCloud, hf_cloud: FakeHfCloud, leak_check: Callable[[], None]
) -> FullRollout:
    """One demo rollout per cloud, with a caller's `env` and a setup command that prints it, read by the tests of
    the full rollout and of where the caller's env reaches: the setup step and the env add nothing the full
    rollout's assertions read (its status, turns, reward, version, install reports), and those assertions read
    nothing of the env's."""
    provider: Provider = request.param
    reports: list[tuple[str, str]] = []
    with ScriptedModelServer(demo_script()) as model:
        rollout_request = demo_request(
            model.base_url, env={"CALLER_MARKER": CALLER_MARKER}, setup=["echo seen=$CALLER_MARKER"]
        )
        result = await run_rollout(
            rollout_request,
            provider.backend(fake_cloud if provider.name == "e2b" else hf_cloud),
            progress=lambda phase, text: reports.append((phase, text)),
        )
    leak_check()
    return FullRollout(provider, result, reports)


def test_a_full_rollout(full_rollout: FullRollout) -> None:
    provider, result, reports = full_rollout.provider, full_rollout.result, full_rollout.reports
    assert result.status == "completed", result.error
    assert (result.backend, result.reward, len(result.proxy_turns)) == (provider.name, 1.0, 3)
    assert result.sandbox_id.startswith(provider.sandbox_id_prefix)
    assert result.opencode_version == "1.18.33"
    assert all(turn.aligned for turn in result.proxy_turns)
    assert result.timings.install_s is not None
    assert [text for phase, text in reports if phase == "install"] == [], "the template or image has it baked in"


def test_a_callers_env_reaches_the_task_but_never_our_root_steps_or_the_proxy(full_rollout: FullRollout) -> None:
    """In a cloud VM the capture proxy runs as root beside the task: the caller's `env` goes to setup, verify and the
    agent only (loader variables such as LD_PRELOAD are refused in the request itself)."""
    result = full_rollout.result
    assert result.status == "completed", result.error
    assert result.setup_results[0].stdout.strip() == f"seen={CALLER_MARKER}"
    assert "caller-preload" not in result.proxy_log_tail


async def test_a_cancelled_creation_still_kills_the_sandbox(
    provider: Provider, sandbox_base: Path, no_leaks: None
) -> None:
    cloud = provider.cloud(sandbox_base, create_delay_s=1.0)
    rollout = asyncio.ensure_future(run_rollout(demo_request(idle_model_url()), provider.backend(cloud)))
    assert await wait_until(lambda: cloud.creating == 1 or rollout.done(), 120), "no creation began"
    rollout.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rollout
    assert await wait_until(lambda: cloud.created == 1 and not cloud.alive, 120)
    assert cloud.created == 1
    assert cloud.alive == {}


async def test_sandboxes_over_the_cap_wait_their_turn(
    provider: Provider, shared_cloud: FakeCloud | FakeHfCloud, no_leaks: None
) -> None:
    backend = provider.backend(shared_cloud, max_sandboxes=1)
    first = await backend.create(SandboxSpec())
    second = asyncio.ensure_future(backend.create(SandboxSpec()))
    await asyncio.sleep(0.5)
    assert not second.done()
    assert len(shared_cloud.alive) == 1
    await first.close()
    await (await asyncio.wait_for(second, timeout=120)).close()


async def test_artifacts_and_skills_on_a_cloud(provider: Provider, shared_cloud: FakeCloud | FakeHfCloud) -> None:
    """A request's artifacts are collected and its skills given to OpenCode through each cloud's own file API."""
    leave = (
        "mkdir -p /tmp/art/sub /home/user/skills/notes && echo kept > /tmp/art/sub/a.txt && "
        "printf -- '---\\nname: notes\\ndescription: Use when taking notes.\\n---\\nBe brief.\\n' "
        "> /home/user/skills/notes/SKILL.md"
    )
    with ScriptedModelServer(demo_script()) as model:
        request = demo_request(
            model.base_url,
            setup=[leave],
            artifacts=["/tmp/art", "/tmp/none"],
            skills_dir="/home/user/skills",
            agent_timeout_s=600,
        )
        result = await run_rollout(request, provider.backend(shared_cloud))
    assert result.status == "completed", result.error
    assert result.artifacts == {"/tmp/art/sub/a.txt": "kept\n"}
    assert [line.split(":")[0] for line in result.artifacts_extra] == ["/tmp/none"]
    assert not [notice for notice in result.notices if notice.code == "skill_left_out"]
