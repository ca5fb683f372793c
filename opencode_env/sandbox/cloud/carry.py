"""The agent's work dir into the grader's box on a cloud backend, made by root from the agent's tree as data.

After the hand-over (the work dir the grader's: processes the agent left behind can no longer change it), root runs
our own walker (tree_carry.py, uploaded into a directory only root can open, its name random) over the agent's work
dir with `python3 -I`: it never follows a link and packs regular files and directories alone into a tar, which the
host carries to the grader's box, where the same walker, as root there, empties the work dir (setup's metadata kept)
and unpacks it, entry by entry under directory descriptors, owned by `user`.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from opencode_env.sandbox import tree_carry
from opencode_env.sandbox.base import CarryLimits, CarryReport, SandboxError

if TYPE_CHECKING:
    from opencode_env.sandbox.cloud.sandbox import CloudSandbox

CARRY_TIMEOUT_S = 300.0
TAR_HEADER_BYTES = 1536
"""A PAX tar's worst case per entry (its header and an extended header), for the archive's size bound."""
WALKER_SOURCE = Path(tree_carry.__file__).read_text(encoding="utf-8")


async def _upload_walker(sandbox: CloudSandbox) -> str:
    private = f"/tmp/opencode-env-carry-{secrets.token_hex(8)}"
    exit_code, output = await sandbox.run_root(f"mkdir -m 700 {private}", 30)
    if exit_code != 0:
        raise SandboxError(f"could not make the work dir copy's directory in {sandbox.sandbox_id}: {output[-300:]}")
    await sandbox.write_root_file(f"{private}/tree_carry.py", WALKER_SOURCE)
    return private


def _walker(sandbox: CloudSandbox, private: str, *args: str) -> str:
    python = shlex.quote(sandbox.tools.python or "python3")
    return f"{python} -I {private}/tree_carry.py {shlex.join(args)}"


async def carry_between(
    source: CloudSandbox, target: CloudSandbox, *, workdir: str, keep: tuple[str, ...], limits: CarryLimits
) -> CarryReport:
    limits_json = json.dumps(asdict(limits))
    private = await _upload_walker(source)
    archive = f"{private}/workdir.tar"
    packed = await source.run(
        _walker(source, private, "pack", workdir, archive, limits_json, json.dumps(list(keep))),
        timeout_s=CARRY_TIMEOUT_S,
        identity="root",
        cwd="/",
    )
    report = _report(source, packed.exit_code, packed.stdout, packed.stderr)
    if report.over:
        return report
    bound = (limits.max_bytes + TAR_HEADER_BYTES * (limits.max_entries + 2)) * 4 // 3 + 4
    encoded = await source.run(
        f"base64 -w 0 {archive} && rm -f {archive}",
        timeout_s=CARRY_TIMEOUT_S,
        identity="root",
        cwd="/",
        max_output_bytes=bound,
    )
    if encoded.exit_code != 0 or encoded.output_truncated:
        raise SandboxError(f"the work dir's archive could not be read in {source.sandbox_id}: {encoded.stderr[-300:]}")
    try:
        data = base64.b64decode(encoded.stdout.strip(), validate=True)
    except binascii.Error as error:
        raise SandboxError(f"the work dir's archive came back damaged: {error}") from error
    into = await _upload_walker(target)
    await target.write_root_bytes(f"{into}/workdir.tar", data)
    uid = '"$(id -u user)"'
    unpack = _walker(target, into, "unpack", f"{into}/workdir.tar", workdir, limits_json, "UID").replace("UID", uid)
    unpacked = await target.run(f"{unpack} && rm -rf {into}", timeout_s=CARRY_TIMEOUT_S, identity="root", cwd="/")
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
