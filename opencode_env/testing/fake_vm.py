"""What both cloud fakes (E2B, Hugging Face) do to a local sandbox to make it a VM's likeness."""

from __future__ import annotations

from opencode_env.sandbox.local.services import LocalSandbox


async def as_a_vm(sandbox: LocalSandbox) -> LocalSandbox:
    """A local sandbox made to look like a VM where it differs: /tmp is root's (sticky, open to all), not `user`'s,
    so its owner's right to rename any entry in it is no task identity's."""
    made = await sandbox.run("chown 0:0 /tmp && chmod 1777 /tmp", timeout_s=60, identity="root", cwd="/")
    if made.exit_code != 0:
        await sandbox.close()
        raise RuntimeError(f"the fake VM's /tmp could not be made root's: {made.stderr[-500:]}")
    return sandbox
