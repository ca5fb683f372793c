"""A declared `.git` rebuilt before verify's first command: its objects, refs, HEAD and index (the data git reads)
under a configuration of ours, and nothing else of the agent's repository (its config and whatever that includes,
hooks, info/ (attributes, excludes), commondir, worktrees, modules, alternates). No program the agent named can run
through git then, whatever setting names it: the repository has none of the agent's settings, so no list of them is
needed (grader_env.py's pinned settings are a second layer)."""

from __future__ import annotations

import shlex

from opencode_env.rollout.state import RolloutState
from opencode_env.sandbox.base import RolloutSandbox

REBUILD_TIMEOUT_S = 120.0
CONFIG_SHA1 = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
CONFIG_SHA256 = (
    "[core]\n\trepositoryformatversion = 1\n\tfilemode = true\n\tbare = false\n[extensions]\n\tobjectformat = sha256\n"
)
DATA_DIRS = ("objects", "refs")
DATA_FILES = ("HEAD", "packed-refs", "index")
REBUILD_SCRIPT = r"""
set -u
g=.git
if [ -L "$g" ] || { [ -e "$g" ] && [ ! -d "$g" ]; }; then rm -f -- "$g"; echo "not a directory: removed"; exit 0; fi
[ -d "$g" ] || exit 0
new=$(mktemp -d .git-rebuilt.XXXXXX) || exit 3
fail() { rm -rf -- "$new" "$g"; echo "the rebuild failed: the agent's .git removed"; exit 4; }
mkdir -p "$new/objects" "$new/refs/heads" "$new/refs/tags" || fail
for part in __DATA_DIRS__; do
  if [ -d "$g/$part" ] && [ ! -L "$g/$part" ]; then cp -RP -- "$g/$part/." "$new/$part/" || fail; fi
done
rm -f -- "$new/objects/info/alternates" "$new/objects/info/http-alternates"
for file in __DATA_FILES__ "$g"/sharedindex.*; do
  name=${file##*/}
  if [ -f "$g/$name" ] && [ ! -L "$g/$name" ]; then cp -P -- "$g/$name" "$new/$name" || fail; fi
done
[ -f "$new/HEAD" ] || printf 'ref: refs/heads/main\n' > "$new/HEAD" || fail
if grep -qiE '^[[:space:]]*objectformat[[:space:]]*=[[:space:]]*sha256[[:space:]]*$' "$g/config" 2>/dev/null; then
  printf '%s' __CONFIG_SHA256__ > "$new/config" || fail
else
  printf '%s' __CONFIG_SHA1__ > "$new/config" || fail
fi
rm -rf -- "$g" || fail
mv -- "$new" "$g" || fail
echo rebuilt
"""


def rebuild_command() -> str:
    """The shell script (run as the grader in the work dir, which it owns after the hand-over)."""
    return (
        REBUILD_SCRIPT.replace("__DATA_DIRS__", " ".join(DATA_DIRS))
        .replace("__DATA_FILES__", " ".join(DATA_FILES))
        .replace("__CONFIG_SHA256__", shlex.quote(CONFIG_SHA256))
        .replace("__CONFIG_SHA1__", shlex.quote(CONFIG_SHA1))
    )


async def rebuild(rollout: RolloutState, sandbox: RolloutSandbox) -> None:
    """The work dir's `.git` rebuilt in `sandbox` (said in the result's enforcement); a rebuild that failed leaves
    no `.git` at all (a warning: an honest grader that reads it then fails, as it would on a repository the agent
    broke)."""
    done = await sandbox.run(
        rebuild_command(),
        timeout_s=rollout.budget("verify", REBUILD_TIMEOUT_S),
        cwd=rollout.workdir,
        identity="grader",
    )
    said = done.stdout.strip()[-300:]
    if done.exit_code != 0 or done.timed_out:
        await sandbox.run(
            "rm -rf -- .git",
            timeout_s=rollout.budget("verify", REBUILD_TIMEOUT_S),
            cwd=rollout.workdir,
            identity="grader",
        )
        rollout.result.warn(
            "git_rebuild_failed",
            f"the declared .git could not be rebuilt, so it was removed: {said or done.stderr[-300:]}",
        )
        return
    if said:
        rollout.result.enforcement["git"] = (
            f"the declared .git: {said} (objects, refs, HEAD and index under our config)"
        )
