"""After `./dev setup` a rollout contacts nothing but its model.

The sandbox's network namespace has loopback only: every connection out goes through the egress proxy, which logs
each attempt (allowed or refused). The model is reached through the capture proxy, outside the sandbox. So a full
rollout whose egress log is empty contacted nothing but the model.
"""

from __future__ import annotations

from pathlib import Path

from opencode_env.sandbox.base import Sandbox, SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.isolation.bubblewrap import AGENT_CONFIG_DIR
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.demo import DEMO_VERIFY
from opencode_env.scripted.script import demo_script
from opencode_env.wire import OPENCODE_VERSION, PLUGIN_PACKAGE
from tests.helpers import rollout


class RememberingBackend(LocalBackend):
    """The local backend, keeping each sandbox it made so the test can read its egress log after the rollout."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__(cached_tools, base_dir=base_dir)
        self.made: list[LocalSandbox] = []

    async def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox = await super().create(spec)
        assert isinstance(sandbox, LocalSandbox)
        self.made.append(sandbox)
        return sandbox


async def test_a_full_rollout_contacts_nothing_but_its_model(sandbox_base: Path, no_leaks: None) -> None:
    backend = RememberingBackend(sandbox_base)
    outcome = await rollout(backend, demo_script(), verify=[*DEMO_VERIFY, 'test -z "$(ls -A ~/.npm 2>/dev/null)"'])
    assert outcome.result.status == "completed", outcome.result.error
    assert len(outcome.exchanges) == 3
    assert [r.exit_code for r in outcome.result.verify_results] == [0, 0, 0], "OpenCode left an npm cache behind"
    # the agent's box and the grader's box: neither tried to reach anything
    assert [sandbox.egress_attempts() for sandbox in backend.made] == [[], []]


async def test_the_config_directory_holds_the_plugin_opencode_would_fetch(backend: LocalBackend) -> None:
    """OpenCode's config directory is its own (under its home): it finds the plugin there, and the task's user and
    root can neither add to it nor remove the shared install (in an image, they do not even see it)."""
    sandbox = await backend.create(SandboxSpec())
    try:
        listed = await sandbox.run(
            f"cat {AGENT_CONFIG_DIR}/node_modules/{PLUGIN_PACKAGE}/package.json", timeout_s=10, identity="agent"
        )
        planted = await sandbox.run(f"touch {AGENT_CONFIG_DIR}/mine", timeout_s=10)
        await sandbox.run(f"rm -rf {AGENT_CONFIG_DIR}/node_modules/{PLUGIN_PACKAGE}", timeout_s=10)
        await sandbox.run(f"rm -rf {AGENT_CONFIG_DIR}/node_modules/{PLUGIN_PACKAGE}", timeout_s=10, identity="root")
        after = await sandbox.run(
            f"cat {AGENT_CONFIG_DIR}/node_modules/{PLUGIN_PACKAGE}/package.json", timeout_s=10, identity="agent"
        )
    finally:
        await sandbox.close()
    assert f'"version": "{OPENCODE_VERSION}"' in listed.stdout, listed.stderr
    assert planted.exit_code != 0, "the task's uid cannot write OpenCode's config directory"
    assert after.stdout == listed.stdout, "the shared install survives the task's user and root"
