"""What each backend declares on itself (`capabilities`, `preflight`) is what it does: every registered backend (the
cloud ones over their fakes), checked against the same behaviour. The stub backend runs no command at all (each
exits 0 after a sleep), so no behaviour shows what it declares: its own test below holds it to declaring nothing it
would need to run a command for."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest

from opencode_env.rollout.proxy_session import proxy_sources
from opencode_env.sandbox import BACKENDS
from opencode_env.sandbox.base import (
    Capabilities,
    Preflight,
    ProxyLaunch,
    ResourceLimits,
    RolloutSandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
)
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire.services import HealthCheck, Service

pytestmark = pytest.mark.timeout(120)
CANARY = "canary-key-5d1e0b"
SPAWNS = 60
"""Background processes the probe starts: past MAX_PROCESSES, well within any backend's own default."""
MAX_PROCESSES = 24


COVERED = {"local": "backend", "e2b": "e2b_fake", "hf": "hf_fake"}
"""Each registered backend, by the fixture that builds it here (the cloud ones over their fakes)."""


@pytest.fixture(params=[*COVERED])
def declared(request: pytest.FixtureRequest) -> SandboxBackend:
    return request.getfixturevalue(COVERED[request.param])  # type: ignore[no-any-return]


@pytest.fixture
async def limited(declared: SandboxBackend, no_leaks: None) -> AsyncIterator[RolloutSandbox]:
    box = await declared.create(SandboxSpec(limits=ResourceLimits(max_processes=MAX_PROCESSES)))
    try:
        yield box
    finally:
        await box.close()


def test_every_registered_backend_is_checked_here() -> None:
    assert set(COVERED) == set(BACKENDS)


async def test_enforces_limits_is_what_the_backend_does(declared: SandboxBackend, limited: RolloutSandbox) -> None:
    """Declared: a command past `max_processes` is refused and `limits_hit()` names it. Not declared: nothing is
    refused, nothing reported (the VM's size is the bound)."""
    attack = f"i=0; while [ $i -lt {SPAWNS} ]; do sleep 1 & i=$((i+1)); done; wait"
    result = await limited.run(attack, timeout_s=60)
    refused = "fork" in result.stderr  # bash: "fork: retry: Resource temporarily unavailable"; dash: "Cannot fork"
    reported = "processes" in limited.limits_hit()
    assert (refused, reported) == (declared.capabilities.enforces_limits,) * 2, result.stderr[-500:]


async def test_proxy_beside_task_root_is_whether_the_tasks_root_reaches_the_proxy(
    declared: SandboxBackend, limited: RolloutSandbox
) -> None:
    """Declared: the capture proxy runs where the task's root runs, whose root reaches the code the proxy runs (and
    so could change it, or read the key from its memory). Not declared: the task's root finds no file of it (the
    local backend runs the proxy from the host's package in a compartment of its own: tests/integration/test_secrets.py
    proves its key out of the sandbox's reach).

    The search reads only the files whose inode changed after the proxy's sources existed, by ctime, which no
    process can set back (tar, cp -p and touch set mtime only): any file holding the sources was written, linked or
    mounted from a file written after the reference. Reading every file instead reads the gigabytes of read-only
    tools mounted into a sandbox (8 s of the quick tier per backend, 26 s when loaded) to the same verdict."""
    reference = "/tmp/.before-the-proxy"
    await limited.run(f"touch {reference} && sleep 0.1", timeout_s=30, identity="root")
    sources = {**proxy_sources(), "opencode_env/proxy/canary.txt": CANARY}
    launch = ProxyLaunch(
        python=limited.tools.python or sys.executable,
        args=("--upstream-url", "http://127.0.0.1:9/v1"),
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        sources=sources,
    )
    proxy = await limited.start_proxy(launch)
    try:
        assert await proxy.call("/healthz", "GET", 30) is not None
        control = f"/tmp/.control-{CANARY}"
        changed = f"find /tmp /home /run /root /opt /srv -type f -newercm {reference} -print0 2>/dev/null"
        look = f"echo {CANARY} > {control} && {changed} | xargs -0r grep -lsF {CANARY}"
        seen = await limited.run(look, timeout_s=60, identity="root")
        found = set(seen.stdout.split()) - {control}
        assert control in seen.stdout, seen.stdout + seen.stderr
        assert bool(found) == declared.capabilities.proxy_beside_task_root, seen.stdout + seen.stderr
    finally:
        await proxy.kill()


async def test_preflight_is_kept_and_a_verdict_only_when_the_backend_ran_one(declared: SandboxBackend) -> None:
    before = declared.preflight_verdict()
    preflight = await declared.preflight()
    assert declared.preflight_verdict() == preflight
    assert isinstance(before, Preflight)
    assert preflight.problem is None, preflight.problem
    assert preflight.proven == isinstance(declared, LocalBackend)


def test_the_declaration_is_one_type_for_every_backend(declared: SandboxBackend) -> None:
    assert type(declared.capabilities) is Capabilities
    assert declared.capabilities.default_concurrency >= 1
    assert declared.capabilities.risk


async def test_the_stub_declares_no_limit_and_no_reachable_proxy_and_runs_nothing() -> None:
    stub = StubBackend()
    assert (stub.capabilities.enforces_limits, stub.capabilities.proxy_beside_task_root) == (False, False)
    box = await stub.create(SandboxSpec(limits=ResourceLimits(max_processes=MAX_PROCESSES)))
    try:
        ran = await box.run(f"echo {CANARY}", timeout_s=5)
        assert (ran.exit_code, ran.stdout, box.limits_hit()) == (0, "", [])
    finally:
        await box.close()
    assert await stub.preflight() == Preflight()


async def test_runs_services_is_whether_a_sidecar_answers_on_the_sandboxs_loopback(
    declared: SandboxBackend, no_leaks: None
) -> None:
    """Declared: a spec's service runs beside the sandbox, reached by its name; not declared: the spec is refused
    by name, never run without its services."""
    image = build_base_image()
    web = Service(
        name="web",
        image=image,
        command=["python3", "-m", "http.server", "8090", "--bind", "127.0.0.1"],
        workdir="/srv",
        healthcheck=HealthCheck(
            test=["curl", "-sf", "--noproxy", "*", "http://127.0.0.1:8090/"], interval_s=0.2, retries=300
        ),
        awaited="service_healthy",
    )
    spec = SandboxSpec(image=image, services=(web,))
    if not declared.capabilities.runs_services:
        with pytest.raises(SandboxError, match="services: "):
            await declared.create(spec)
        return
    box = await declared.create(spec)
    try:
        reached = await box.run("curl -sf -o /dev/null -w '%{http_code}' http://web:8090/", timeout_s=30)
        assert reached.stdout == "200", reached.stderr
    finally:
        await box.close()
