"""The directories above the work dir, and the agent's HOME, as verify in the agent's box sees them: only what they
held after setup. Their entries' names are listed after setup; before verify, every entry added since is removed and
recorded, whatever its name or kind (a conftest.py, an ini file, a link, a directory of them), except the host's own
paths on the way (the work dir, the logs, the rollout's control and OpenCode's data directories). Listing and
comparing use shell builtins alone, so no program the agent planted runs as root; the removal runs `rm` from verify's
narrowed PATH (verify_path.py). The grader's box needs none of it: nothing of the agent's outside its work dir is
ever copied there."""

from __future__ import annotations

import posixpath

from opencode_env.rollout.state import Ancestors, RolloutState
from opencode_env.sandbox.base import (
    HOME,
    LOGS_DIR,
    OPENCODE_CONFIG_DIR,
    OPENCODE_DATA_DIR,
    ROLLOUT_DIR,
    RolloutSandbox,
)
from opencode_env.wire.grading import IntegrityFinding, capped

TIMEOUT_S = 60.0
MAX_NAMES = 1024
"""Lines of the listing at most (its names travel back in an environment variable)."""
LIST_SCRIPT = r"""
nl='
'
set -f
IFS=$nl
for dir in $DIRS; do
  [ -w "$dir" ] || continue
  printf 'D%s\n' "$dir"
  set +f
  for entry in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
    { [ -e "$entry" ] || [ -L "$entry" ]; } || continue
    case $entry in *"$nl"*) continue ;; esac
    printf 'E%s\n' "$entry"
  done
  set -f
done
"""
"""Run as the agent's identity: each of $DIRS it can write (`D`), then each entry there by full path (`E`), one a
line (a name with a newline in it is never listed: the removal then takes it as new). Only a directory the agent can
write can hold an entry of its."""
CLEAR_SCRIPT = r"""
nl='
'
set -f
IFS=$nl
for dir in $DIRS; do
  set +f
  for entry in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
    { [ -e "$entry" ] || [ -L "$entry" ]; } || continue
    case $entry in
      *"$nl"*) ;;
      *) case "$nl$KNOWN$nl$KEEP$nl" in *"$nl$entry$nl"*) continue ;; esac ;;
    esac
    printf '%s\n' "$entry"
    rm -rf -- "$entry" || echo "not removed: $entry" >&2
  done
  set -f
done
"""
"""Remove every entry of $DIRS that is neither in $KNOWN (the listing after setup) nor in $KEEP, printing each."""


def directories(workdir: str) -> list[str]:
    """Every directory above `workdir`, and the agent's HOME."""
    above, path = [], posixpath.dirname(workdir.rstrip("/"))
    while True:
        above.append(path)
        if path == "/":
            break
        path = posixpath.dirname(path)
    return sorted({*above, HOME})


def kept(workdir: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The host's own paths and every directory on the way to one: the work dir, the logs (verify's channel and
    the agent's log), the control and OpenCode's data and configuration directories."""
    paths = []
    for own in (workdir, LOGS_DIR, ROLLOUT_DIR, OPENCODE_DATA_DIR, OPENCODE_CONFIG_DIR, *extra):
        path = posixpath.normpath(own)
        while path != "/":
            paths.append(path)
            path = posixpath.dirname(path)
    return sorted(set(paths))


async def snapshot(rollout: RolloutState) -> None:
    """After setup, before the agent (verify in the agent's box only): the names above the work dir."""
    if rollout.request.verify_sandbox != "same":
        return
    listed = await rollout.sandbox.run(
        LIST_SCRIPT,
        timeout_s=rollout.budget("setup", TIMEOUT_S),
        env={"DIRS": "\n".join(directories(rollout.workdir))},
        identity="user",
        cwd="/",
    )
    lines = listed.stdout.splitlines()
    if listed.exit_code != 0 or listed.output_truncated or len(lines) > MAX_NAMES:
        rollout.result.warn(
            "ancestors_unsnapshotted",
            "the directories above the work dir could not be listed after setup, so verify in the agent's box sees "
            "whatever the agent leaves there",
        )
        return
    rollout.ancestors = Ancestors(
        writable=[line[1:] for line in lines if line.startswith("D")],
        names=[line[1:] for line in lines if line.startswith("E")],
    )


async def clear(rollout: RolloutState, sandbox: RolloutSandbox, path: str | None) -> str | None:
    """Before verify in the agent's box: every entry added above the work dir since setup removed, a finding each.
    What was left when some could not be removed (only the agent's acts can make it so), else None."""
    before = rollout.ancestors
    if before is None or not before.writable:
        return None
    env = {
        "DIRS": "\n".join(before.writable),
        "KNOWN": "\n".join(before.names),
        "KEEP": "\n".join(kept(rollout.workdir, (sandbox.opencode_data_dir,))),
    }
    if path is not None:
        env["PATH"] = path
    cleared = await sandbox.run(
        CLEAR_SCRIPT, timeout_s=rollout.budget("verify", TIMEOUT_S), env=env, identity="root", cwd="/"
    )
    removed = [line for line in cleared.stdout.splitlines() if line]
    rollout.result.integrity += capped(
        [
            IntegrityFinding(
                path=posixpath.relpath(entry, rollout.workdir)[:300],
                kind="outside_work_dir",
                act="created",
                response="removed",
            )
            for entry in removed
        ]
    )
    if cleared.exit_code != 0 or cleared.timed_out or cleared.stderr.strip():
        return f"the directories above the work dir could not be cleared: {cleared.stderr[-300:]}"
    return None
