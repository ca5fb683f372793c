"""What a container's root does at start (Harbor's entrypoints: `/etc/hosts` entries, a server on port 80), done by
the sandbox's own root in its own namespaces, and nothing of it reaching the host or the agent's identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.isolation.bubblewrap import UNPRIVILEGED_PORT_START, holder_script

pytestmark = pytest.mark.timeout(600)
BIND = "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', {port})); print('BOUND')\""


def test_a_holder_on_the_hosts_network_leaves_its_ports_alone() -> None:
    assert UNPRIVILEGED_PORT_START in holder_script(True, own_network=True)
    assert UNPRIVILEGED_PORT_START not in holder_script(True, own_network=False)


async def test_the_sandbox_root_writes_its_hosts_and_binds_low_ports(backend: LocalBackend) -> None:
    host_ports = Path(UNPRIVILEGED_PORT_START).read_text()
    host_hosts = Path("/etc/hosts").read_text()
    sandbox = await backend.create(SandboxSpec(image=build_base_image()))
    try:
        added = await sandbox.run(
            "echo '127.0.0.1 svc.internal' >> /etc/hosts && getent hosts svc.internal", timeout_s=60, identity="root"
        )
        assert (added.exit_code, added.stdout.split()) == (0, ["127.0.0.1", "svc.internal"]), added.stderr
        tampered = await sandbox.run("echo '10.0.0.1 evil' >> /etc/hosts", timeout_s=60, identity="user")
        assert tampered.exit_code != 0, "the agent's identity cannot change the hosts file"
        for port in (80, 443, 1):
            bound = await sandbox.run(BIND.format(port=port), timeout_s=60, identity="root")
            assert "BOUND" in bound.stdout, (port, bound.stderr)
        sysctl = await sandbox.run(f"echo 1024 > {UNPRIVILEGED_PORT_START}", timeout_s=60, identity="root")
        assert sysctl.exit_code != 0, "the sandbox's root cannot change its namespace's sysctls"
    finally:
        await sandbox.close()
    assert Path(UNPRIVILEGED_PORT_START).read_text() == host_ports, "the host's network is untouched"
    assert Path("/etc/hosts").read_text() == host_hosts
