"""Our own per-rollout processes inside limits (issue 21, item 2): the capture proxy lives in a cgroup of its own
beside its rollout's (bounded, and out of reach of the agent's own memory or fork bomb), and one sandbox holds at
most a fixed number of egress connections, whatever it opens."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.isolation.cgroup import CGROUP_ROOT, PARENT, PROXY_LIMITS, detect, proxy_cgroup_name
from opencode_env.sandbox.local.isolation.egress import EgressPolicy, EgressProxy
from opencode_env.scripted.script import demo_script
from tests.helpers import rollout


async def test_the_proxy_runs_in_its_own_bounded_cgroup(backend: LocalBackend) -> None:
    version = detect()
    assert version is not None, "this test needs a writable cgroup (root)"
    pids: list[int] = []

    class Watching(LocalBackend):
        async def create(self, spec):  # type: ignore[no-untyped-def]
            sandbox: LocalSandbox = await super().create(spec)
            original = sandbox.start_proxy

            async def start(launch):  # type: ignore[no-untyped-def]
                proxy = await original(launch)
                pid = proxy.process.pid  # type: ignore[attr-defined]
                name = proxy_cgroup_name(sandbox.layout.root.name)
                for _ in range(100):  # the proxy's launcher joins the cgroup as its first step, then execs
                    if name in Path(f"/proc/{pid}/cgroup").read_text():
                        break
                    await asyncio.sleep(0.05)
                pids.append(pid)
                pids.append(int(name in Path(f"/proc/{pid}/cgroup").read_text()))
                limit = (
                    CGROUP_ROOT / "memory" / PARENT / name / "memory.limit_in_bytes"
                    if version == "v1"
                    else CGROUP_ROOT / PARENT / name / "memory.max"
                )
                pids.append(int(limit.read_text()))
                return proxy

            sandbox.start_proxy = start  # type: ignore[method-assign]
            return sandbox

    watching = Watching(backend._tools_resolver, base_dir=backend._base_dir)
    outcome = await rollout(watching, demo_script())
    assert outcome.result.status == "completed", outcome.result.error
    assert pids[1] == 1, "the proxy's process is in the rollout's proxy cgroup"
    assert pids[2] == PROXY_LIMITS.memory_bytes


async def test_one_sandbox_holds_at_most_the_egress_cap() -> None:
    proxy = EgressProxy(EgressPolicy(internet=True), rollout="unit", max_connections=16)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    await proxy.serve(listener)
    clients = []
    try:
        for _ in range(40):
            clients.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.5)
        assert len(proxy._tasks) == 16
        closed = 0
        for reader, _ in clients:
            try:
                data = await asyncio.wait_for(reader.read(1), timeout=0.2)
            except TimeoutError:
                continue
            closed += data == b""
        assert closed == 24
        refused = [a for a in proxy.attempts if not a.allowed]
        assert len(refused) == 24
        assert refused[0].reason == "over 16 connections at once"
    finally:
        for _, writer in clients:
            writer.close()
        await proxy.close()
