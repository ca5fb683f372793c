"""The trusted-root boundary on a cloud VM's layout (both fakes): once OpenCode's directories and its tools' broker
are made, every path a trusted process of ours executes, loads or reads as configuration there (OpenCode's private
root and everything in it, OpenCode's binary, the programs root and OpenCode resolve by name through the trusted
PATH, each directory of that PATH, the broker's interpreter, the user database), and every directory above each, is
probed as each identity a task or the model runs as on the VM (`user`, the grader) by trying what would replace it:
rename, create an entry, open for writing, chmod. Nothing is found.

The probe is tests/trusted_walk.py's; the paths come from what the backend builds (its AgentRoot, the interpreter
root resolved, the PATH its launch keeps), not from a list written here."""

from __future__ import annotations

import json
import shlex

import pytest

from opencode_env.sandbox.base import SandboxBackend, SandboxSpec
from opencode_env.sandbox.cloud.agent_env import TRUSTED_PATH
from opencode_env.sandbox.cloud.sandbox import CloudSandbox
from tests.trusted_walk import PROBE

pytestmark = pytest.mark.timeout(600)
BY_NAME = ("bash", "sh", "setpriv", "find", "readlink", "python3", "git", "rg", "env", "id")
"""What our root steps and OpenCode run by name (OpenCode: git and rg for its tools; root: the rest)."""
TASK_IDENTITIES = ("user", "grader")
ALLOWED = {("/tmp", "created an entry")}
"""A new entry in /tmp (root's, sticky) takes no name of ours: OpenCode's root is made with mkdir, which fails."""


async def trusted_paths(sandbox: CloudSandbox) -> dict[str, list[str]]:
    root = await sandbox.made_agent_root()
    names = " ".join(BY_NAME)
    listing = f'{TRUSTED_PATH}echo "$PATH"; for n in {names}; do command -v $n || :; done'
    exit_code, output = await sandbox.run_root(listing, 60)
    assert exit_code == 0, output
    path_line, *programs = output.strip().splitlines()
    assert "python3" in " ".join(programs), programs
    probe = {*path_line.split(":"), *programs, "/etc/passwd", "/etc/group"}
    if sandbox.tools.opencode:
        probe.add(sandbox.tools.opencode)
    return {"walk": [root.path], "probe": sorted(probe - {""})}


@pytest.mark.parametrize("backend_name", ["e2b_fake", "hf_fake"])
async def test_no_task_identity_can_change_what_a_trusted_process_of_ours_runs_or_reads_on_a_vm(
    backend_name: str, request: pytest.FixtureRequest, no_leaks: None
) -> None:
    backend: SandboxBackend = request.getfixturevalue(backend_name)
    sandbox = await backend.create(SandboxSpec())
    try:
        assert isinstance(sandbox, CloudSandbox)
        await sandbox.write_control_file("opencode.json", "{}")
        _, _, broker = await sandbox._opencode_command("true", {"OPENCODE_ENV_UPSTREAM_KEY": "k", "TASK": "t"})
        try:
            paths = await trusted_paths(sandbox)
            script = f"python3 -I -S -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(paths))}"
            found = {}
            for identity in TASK_IDENTITIES:
                ran = await sandbox.run(script, timeout_s=300, identity=identity, cwd="/")  # type: ignore[arg-type]
                assert ran.exit_code == 0, (identity, ran.stderr[-2000:])
                report = json.loads(ran.stdout.strip().splitlines()[-1])
                assert report["probed"] >= 10, report
                found[identity] = [item for item in report["found"] if tuple(item) not in ALLOWED]
        finally:
            await broker.kill()
    finally:
        await sandbox.close()
    expected: dict[str, list[list[str]]] = {identity: [] for identity in TASK_IDENTITIES}
    if backend_name == "e2b_fake":
        # Where the E2B fake is not a VM: its /tmp is its local sandbox's, `user`'s (the owner of a sticky directory
        # may rename any entry in it; a VM's /tmp is root's), and its grader has a /tmp of its own.
        root = sandbox.agent_root.path
        expected = {"user": [["/tmp", "chmod (owns it)"], [root, "renamed"]], "grader": [[root, "missing"]]}
    assert found == expected, (found, paths)
