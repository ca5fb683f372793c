"""Memory admission on the local backend: sandboxes whose memory limits would add up beyond the machine's budget
wait their turn (first come, first served, within their deadline); one that could never fit is refused with the
field and the budget named."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import make_backend
from opencode_env.sandbox.base import ResourceLimits, SandboxError, SandboxSpec
from opencode_env.sandbox.local.admission import MemoryAdmission, machine_memory_mb, memory_budget_mb
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.store import HOST_IMAGE
from opencode_env.sandbox.local.isolation.cgroup import PROXY_LIMITS
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.demo import DEMO_VERIFY, demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.settings import Settings
from opencode_env.wire import RolloutRequest

SMALL = SandboxSpec(image=HOST_IMAGE, limits=ResourceLimits(memory_mb=64))
"""64 MiB plus the proxy's 512: 576 MiB reserved."""


async def test_reservations_wait_their_turn_in_order() -> None:
    admission = MemoryAdmission(1000)
    await admission.admit(600)
    big = asyncio.ensure_future(admission.admit(600))
    small = asyncio.ensure_future(admission.admit(100))
    await asyncio.sleep(0.05)
    assert (big.done(), small.done()) == (False, False), "the small one fits but waits behind the first waiter"
    admission.release(600)
    await asyncio.wait_for(asyncio.gather(big, small), timeout=1)
    assert admission.reserved_mb == 700


async def test_a_cancelled_waiter_gives_its_place_up() -> None:
    admission = MemoryAdmission(1000)
    await admission.admit(900)
    waiter = asyncio.ensure_future(admission.admit(500))
    after = asyncio.ensure_future(admission.admit(50))
    await asyncio.sleep(0.05)
    waiter.cancel()
    await asyncio.wait_for(after, timeout=1)
    assert admission.reserved_mb == 950


async def test_what_could_never_fit_is_refused_at_once() -> None:
    with pytest.raises(SandboxError, match=r"memory_mb: 2000 MiB .* budget of 1000 MiB"):
        await MemoryAdmission(1000).admit(2000)


def test_the_budget_is_the_machines_memory_times_the_factor() -> None:
    assert memory_budget_mb(0.5) == int(machine_memory_mb() * 0.5)
    assert memory_budget_mb() == int(machine_memory_mb() * 4)
    with pytest.raises(SandboxError, match="OPENCODE_ENV_MEMORY_OVERCOMMIT"):
        memory_budget_mb(0)
    with pytest.raises(ValidationError, match="OPENCODE_ENV_MEMORY_OVERCOMMIT"):
        Settings.load({"OPENCODE_ENV_MEMORY_OVERCOMMIT": "lots"})


async def test_the_backend_the_registry_builds_takes_the_operators_factor() -> None:
    backend = make_backend("local", Settings.load({"OPENCODE_ENV_MEMORY_OVERCOMMIT": "0.001"}))
    with pytest.raises(SandboxError, match=rf"budget of {int(machine_memory_mb() * 0.001)} MiB"):
        await backend.create(SMALL)


async def test_a_sandbox_waits_for_room_and_starts_when_one_closes(opencode_binary: Path, sandbox_base: Path) -> None:
    backend = LocalBackend(cached_tools, base_dir=sandbox_base, admission=MemoryAdmission(1200))
    first = await backend.create(SMALL)
    second = await backend.create(SMALL)
    third = asyncio.ensure_future(backend.create(SMALL))
    try:
        await asyncio.sleep(0.5)
        assert not third.done(), "two sandboxes hold 1,152 of 1,200 MiB: the third waits"
        await first.close()
        started = await asyncio.wait_for(third, timeout=30)
        assert (await started.run("true", timeout_s=30)).exit_code == 0
        await started.close()
    finally:
        await second.close()
        if not third.done():
            third.cancel()


async def test_a_rollout_too_big_for_the_machine_says_so(opencode_binary: Path, sandbox_base: Path) -> None:
    backend = LocalBackend(cached_tools, base_dir=sandbox_base, admission=MemoryAdmission(1000))
    with ScriptedModelServer(demo_script()) as model:
        result = await run_rollout(demo_request(model.base_url, memory_mb=4096), backend)
    assert result.status == "sandbox_error"
    assert "memory_mb: 4608 MiB" in (result.error or "")


async def test_rollouts_with_a_grader_box_never_wait_on_each_other(opencode_binary: Path, sandbox_base: Path) -> None:
    """Room for two agent boxes but not for three boxes: each rollout is admitted with room for its grader's box, so
    the second waits for the first instead of both holding an agent box while their grader boxes wait forever."""
    memory_mb = 256
    one_box = memory_mb + PROXY_LIMITS.memory_bytes // 2**20
    backend = LocalBackend(cached_tools, base_dir=sandbox_base, admission=MemoryAdmission(2 * one_box + 64))
    request = RolloutRequest(
        instruction="Write add.py.",
        solution=["printf 'def add(a, b):\\n    return a + b\\n' > add.py"],
        verify=DEMO_VERIFY,
        memory_mb=memory_mb,
        total_timeout_s=600,
    )
    results = await asyncio.wait_for(asyncio.gather(*(run_rollout(request, backend) for _ in range(2))), timeout=600)
    assert [(result.status, result.reward, result.grade_isolation) for result in results] == [
        ("completed", 1.0, "fresh_box")
    ] * 2, [result.error for result in results]
