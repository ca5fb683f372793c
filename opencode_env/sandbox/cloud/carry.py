"""The agent's work dir into the grader's box on a cloud backend, made by root from the agent's tree as data.

After the hand-over (the work dir the grader's: processes the agent left behind can no longer change it), root runs
our own walker (tree_carry.py, its source on the command line of `python3 -I -c`) over the agent's work dir: it
never follows a link and packs regular files and directories alone into a tar, printed as base64, which the host
carries to the grader's box (written under a random name in its /tmp, root's), where the same walker, as root there,
empties the work dir (setup's metadata kept) and unpacks it, entry by entry under directory descriptors, owned by
`user`. Before the pack, the walker surveys the grader's box (its links and metadata, what the unpack keeps) and the
pack reads that survey: what the agent's box holds just as the grader's does (setup's `.git`, its links, its
bytecode) is then no finding, as on the local backend, where the walker sees both trees.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from opencode_env.inside import source
from opencode_env.sandbox import tree_carry
from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    CarryLimits,
    CarryReport,
    Identity,
    ProvidedTools,
    SandboxError,
)
from opencode_env.wire import CommandResult


class CloudSandbox(Protocol):
    """What the copy needs of a cloud sandbox: commands as root, a file written as root."""

    sandbox_id: str
    tools: ProvidedTools

    async def run(
        self,
        cmd: str,
        *,
        timeout_s: float,
        cwd: str = ...,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        identity: Identity = "user",
    ) -> CommandResult: ...

    async def write_root_bytes(self, path: str, data: bytes) -> None: ...


CARRY_TIMEOUT_S = 300.0
TAR_HEADER_BYTES = 1536
"""A PAX tar's worst case per entry (its header and an extended header), for the archive's size bound."""
SURVEY_OUTPUT_BYTES = tree_carry.SURVEY_MAX_BYTES + 2**16
"""The survey's JSON line at most (the walker stops adding paths past SURVEY_MAX_BYTES)."""
WALKER_SOURCE = f"""import sys, types
for name in ("opencode_env", "opencode_env.inside", "opencode_env.inside.nofollow"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["opencode_env"].inside = sys.modules["opencode_env.inside"]
sys.modules["opencode_env.inside"].nofollow = sys.modules["opencode_env.inside.nofollow"]
exec(compile({source("nofollow.py")!r}, "nofollow.py", "exec"), sys.modules["opencode_env.inside.nofollow"].__dict__)
exec(compile({Path(tree_carry.__file__).read_text(encoding="utf-8")!r}, "tree_carry.py", "exec"), globals())
"""
"""The walker and the one module of ours it imports (as `opencode_env.inside.nofollow`), as one program for
`python3 -I -c`."""


def _walker(sandbox: CloudSandbox, *args: str) -> str:
    """Our walker run by root from its source on the command line: nothing of it lives in a file the VM could
    change first."""
    python = shlex.quote(sandbox.tools.python or "python3")
    return f"{python} -I -c {shlex.quote(WALKER_SOURCE)} {shlex.join(args)}"


async def carry_between(
    source: CloudSandbox, target: CloudSandbox, *, workdir: str, keep: tuple[str, ...], limits: CarryLimits
) -> CarryReport:
    """The survey in the grader's VM; two commands in the agent's VM (the hand-over, done by the caller, and the pack,
    whose output is the archive); the archive written into the grader's VM and unpacked there."""
    limits_json, keep_json = json.dumps(asdict(limits)), json.dumps(list(keep))
    surveyed = await target.run(
        _walker(target, "survey", workdir, limits_json, keep_json),
        timeout_s=CARRY_TIMEOUT_S,
        identity="root",
        cwd="/",
        max_output_bytes=SURVEY_OUTPUT_BYTES,
    )
    if surveyed.exit_code != 0 or surveyed.output_truncated:
        raise SandboxError(
            f"surveying the grader's work dir failed in {target.sandbox_id} (exit {surveyed.exit_code}): "
            f"{surveyed.stderr[-500:]}"
        )
    survey = f"/tmp/opencode-env-survey-{secrets.token_hex(16)}.json"
    await source.write_root_bytes(survey, surveyed.stdout.encode("ascii"))
    bound = (limits.max_bytes + TAR_HEADER_BYTES * (limits.max_entries + 2)) * 4 // 3 + 2**20
    pack = _walker(source, "pack", workdir, limits_json, keep_json, survey)
    packed = await source.run(
        f"{pack}; status=$?; rm -f {survey}; exit $status",
        timeout_s=CARRY_TIMEOUT_S,
        identity="root",
        cwd="/",
        max_output_bytes=bound,
    )
    if packed.output_truncated:
        raise SandboxError(f"the work dir's archive in {source.sandbox_id} is over its bound of {bound} bytes")
    encoded, _, report_line = packed.stdout.rstrip("\n").rpartition("\n")
    report = _report(source, packed.exit_code, report_line, packed.stderr)
    if report.over:
        return report
    try:
        data = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error as error:
        raise SandboxError(f"the work dir's archive came back damaged: {error}") from error
    archive = f"/tmp/opencode-env-carry-{secrets.token_hex(16)}.tar"
    await target.write_root_bytes(archive, data)
    unpack = _walker(target, "unpack", archive, workdir, limits_json) + ' "$(id -u user)"'
    unpacked = await target.run(
        f"{unpack}; status=$?; rm -f {archive}; exit $status", timeout_s=CARRY_TIMEOUT_S, identity="root", cwd="/"
    )
    landed = _report(target, unpacked.exit_code, unpacked.stdout, unpacked.stderr)
    report.skipped += landed.skipped
    return report


def _report(sandbox: CloudSandbox, exit_code: int | None, stdout: str, stderr: str) -> CarryReport:
    if exit_code != 0:
        raise SandboxError(f"copying the work dir failed in {sandbox.sandbox_id} (exit {exit_code}): {stderr[-500:]}")
    try:
        return tree_carry.Report.from_json(stdout.strip().splitlines()[-1])
    except (ValueError, KeyError, IndexError) as error:
        raise SandboxError(f"the work dir copy's report is damaged: {stdout[-300:]!r}") from error
