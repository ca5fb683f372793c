"""The agent's work dir carried from its sandbox into a fresh one, for a verify that shares nothing else with it.

It travels as a gzip'd tar through the sandbox seam (run, write_file), so every backend can do it. The archive is
made by the grader, after the work dir was handed to it: no process of the agent can change the tree while it is
packed. A work dir too large to carry fails the copy, which fails verify: its size is the agent's doing.
"""

from __future__ import annotations

import base64
import binascii
import shlex
import time

from opencode_env.sandbox.base import WORKDIR, Sandbox
from opencode_env.wire import CommandResult

COPY_LABEL = "copy the work dir into a fresh sandbox"
ARCHIVE = "/tmp/.opencode-env-workdir.tar.gz"


def pack_command(workdir: str) -> str:
    return f"set -o pipefail; tar --numeric-owner -C {shlex.quote(workdir)} -czf - . | base64 -w 0"


def unpack_command(workdir: str) -> str:
    quoted = shlex.quote(workdir)
    return f"set -e; find {quoted} -mindepth 1 -delete; tar -xzf {ARCHIVE} -C {quoted} --no-same-owner; rm -f {ARCHIVE}"


async def copy_workdir(
    source: Sandbox, target: Sandbox, *, timeout_s: float, limit_bytes: int, workdir: str = WORKDIR
) -> CommandResult:
    """Replace the target's work dir by the source's; the outcome as a command result (a failure names why)."""
    started = time.monotonic()
    packed = await source.run(
        pack_command(workdir),
        timeout_s=timeout_s,
        identity="grader",
        max_output_bytes=limit_bytes * 4 // 3 + 4,
        cwd=workdir,
    )
    if packed.timed_out or packed.exit_code != 0:
        return _failed(started, f"packing the work dir failed (exit {packed.exit_code}): {packed.stderr[-500:]}")
    if packed.output_truncated:
        return _failed(started, f"the work dir's archive is over the {limit_bytes} bytes a fresh verify carries")
    try:
        archive = base64.b64decode(packed.stdout.strip(), validate=True)
    except binascii.Error as error:
        return _failed(started, f"the work dir's archive came back damaged: {error}")
    await target.write_file(ARCHIVE, archive)
    unpacked = await target.run(unpack_command(workdir), timeout_s=timeout_s, cwd="/")
    if unpacked.exit_code != 0:
        return _failed(started, f"unpacking the work dir failed (exit {unpacked.exit_code}): {unpacked.stderr[-500:]}")
    return CommandResult(
        cmd=COPY_LABEL,
        exit_code=0,
        stdout=f"{len(archive)} bytes (gzip'd tar)",
        duration_s=round(time.monotonic() - started, 4),
    )


def _failed(started: float, why: str) -> CommandResult:
    return CommandResult(cmd=COPY_LABEL, exit_code=1, stderr=why, duration_s=round(time.monotonic() - started, 4))
