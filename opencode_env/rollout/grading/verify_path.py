"""Verify's PATH in the agent's box: only the directories the agent's identity cannot write, nor any directory above
them, nor any entry in them (the kernel asked, as that identity, by shell builtins alone: no program is looked up
while the answer is not in). A program the agent put in a writable
`/usr/local/bin` then never wins a lookup (`pytest`, `python3`, `bash`, a `#!/usr/bin/env` interpreter): what is
found is what the image and setup put there, whatever the name."""

from __future__ import annotations

from collections.abc import Mapping

from opencode_env.rollout.state import RolloutState
from opencode_env.sandbox.base import RolloutSandbox

CHECK_TIMEOUT_S = 60.0
PATH_MAX_CHARS = 8192
SAFE_DIRS_SCRIPT = r"""
unsafe() {
  case "$1" in /*) ;; *) return 0 ;; esac
  d=$1
  while :; do
    [ -w "$d" ] && return 0
    [ "$d" = / ] && break
    d=${d%/*}; [ -n "$d" ] || d=/
  done
  for entry in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -w "$entry" ] && return 0
  done
  return 1
}
set -f
IFS=:
for dir in $CHECKED_PATH; do
  set +f
  if unsafe "$dir"; then printf 'drop %s\n' "$dir"; else printf 'keep %s\n' "$dir"; fi
  set -f
done
"""


async def path_of(rollout: RolloutState, sandbox: RolloutSandbox, env: Mapping[str, str]) -> str:
    """The PATH verify's commands would get (the grader's, with verify's environment)."""
    shown = await sandbox.run(
        'printf %s "$PATH"', timeout_s=rollout.budget("verify", CHECK_TIMEOUT_S), env=env, identity="grader", cwd="/"
    )
    return shown.stdout[:PATH_MAX_CHARS] if shown.exit_code == 0 else ""


async def narrowed(rollout: RolloutState, sandbox: RolloutSandbox, env: Mapping[str, str]) -> str | None:
    """Verify's PATH with every directory the agent could write left out (each dropped one a warning); None when
    the check could not run (the backend's PATH then stands, with a warning)."""
    path = await path_of(rollout, sandbox, env)
    checked = await sandbox.run(
        SAFE_DIRS_SCRIPT,
        timeout_s=rollout.budget("verify", CHECK_TIMEOUT_S),
        env={"CHECKED_PATH": path},
        identity="user",
        cwd="/",
    )
    lines = checked.stdout.splitlines()
    if checked.exit_code != 0 or not path:
        rollout.result.warn(
            "verify_path_unchecked", "verify's PATH could not be checked for directories the agent can write"
        )
        return None
    kept = [line[5:] for line in lines if line.startswith("keep ")]
    dropped = [line[5:] for line in lines if line.startswith("drop ")]
    if dropped:
        rollout.result.warn(
            "verify_path_narrowed",
            f"verify's PATH leaves out what the agent could write: {', '.join(dropped)[:500]}",
        )
    return ":".join(kept)
