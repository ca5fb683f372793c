"""Verify's environment: what no file in the work dir can steer, whatever command the task gives. No bytecode of
the agent's read, the work dir last on sys.path, no user site, and git sees no repository unless the task declares
the agent's `.git` part of the solution, then read with every program-running setting pinned. The task's own
variables come first and these win. docs/grading.md says why each."""

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
