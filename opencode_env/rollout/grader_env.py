"""Verify's environment: what no file in the work dir can steer, whatever command the task gives.

- No bytecode of the agent's is read: the work dir's is all removed before verify (integrity.py) and verify writes
  none; when the work dir could not be listed, Python reads and writes bytecode only under the grader's own fresh
  directory (PYTHONPYCACHEPREFIX, which pytest's assertion-rewrite cache follows);
  PYTHONSAFEPATH keeps the work dir from coming first on sys.path (the grader's sitecustomize puts it last);
  no user site.
- git sees no repository (GIT_DIR names one that does not exist), unless the task declares the agent's `.git` part
  of the solution (`solution_files`): a repository the agent shaped can run a program through any of its files
  (`.git/config`, a `commondir` pointing at another config, `info/attributes` plus a `filter.*.clean`), and no
  list of settings closes that. A declared repository is read with every setting that runs a program pinned at the
  command-line level (GIT_CONFIG_COUNT, which beats any repository's `.git/config`), no system or global config,
  none above the work dir and no bare repository it was not told of; it is the work dir's `.git` itself (GIT_DIR,
  and GIT_COMMON_DIR so a `commondir` naming another directory with another config is never followed, GIT_WORK_TREE
  the work dir); its config and hooks are restored from before the agent ran besides (integrity.py).
- The task's own variables come first and these win: a task cannot need the agent's bytecode or git hooks.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping

from opencode_env.sandbox.grader_python import GRADER_HOME, GRADER_PYCACHE_DIR, GRADER_PYTHON_DIR

GIT_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("sequence.editor", "true"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("credential.helper", ""),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("protocol.ext.allow", "never"),
    ("safe.bareRepository", "explicit"),
)
"""Each a setting a repository's config can use to run a program, pinned to nothing that runs (`credential.helper`
empty clears the list). `diff.external` has no harmless value (empty makes `git diff` fail): the restored
`.git/config` removes the agent's."""


NO_REPOSITORY = f"{GRADER_HOME}/no-git-repository-unless-solution_files-names-.git"
"""What GIT_DIR names in verify when the task did not declare the agent's repository: nothing (git says so)."""


def declares_repository(solution_files: Iterable[str]) -> bool:
    """The task declares the agent's `.git` part of the solution (a path under it in `solution_files`)."""
    return any(posixpath.normpath(path).split("/", 1)[0] == ".git" for path in solution_files)


def verify_environment(
    task_env: Mapping[str, str], workdir: str, *, bytecode_removed: bool = False, agent_repository: bool = False
) -> dict[str, str]:
    """The variables verify's commands run with: the task's, then the grader's, which win. `bytecode_removed`: the
    work dir holds no bytecode (integrity.py removed it all): Python keeps the image's own (no recompiling every
    installed module, 2 s of CPU per rollout for pytest alone) and writes none; else every module's bytecode comes
    from the grader's own directory. `agent_repository`: git may read the work dir's `.git` (hardened), else none."""
    env = dict(task_env)
    if bytecode_removed:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = GRADER_PYCACHE_DIR
    env.update(
        PYTHONSAFEPATH="1",
        PYTHONPATH=GRADER_PYTHON_DIR,
        PYTHONNOUSERSITE="1",
        GIT_CEILING_DIRECTORIES=posixpath.dirname(workdir.rstrip("/")) or "/",
        GIT_PAGER="cat",
        PAGER="cat",
        GIT_EDITOR="true",
        GIT_SSH_COMMAND="false",
        GIT_ASKPASS="false",
        GIT_TERMINAL_PROMPT="0",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
    )
    if agent_repository:
        repository = posixpath.join(workdir, ".git")
        env.update(GIT_DIR=repository, GIT_COMMON_DIR=repository, GIT_WORK_TREE=workdir)
    else:
        env["GIT_DIR"] = NO_REPOSITORY
    env["GIT_CONFIG_COUNT"] = str(len(GIT_OVERRIDES))
    for index, (key, value) in enumerate(GIT_OVERRIDES):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env
