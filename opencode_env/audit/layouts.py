"""Two grading layouts for one task, as pure transforms of its request.

native: what the task's own harness does. Harbor runs the agent and a root grader in one container, with nothing
between them; a request file's harness grades in the agent's box. So: verify in the agent's box (`same`), as root,
with the variables our grader sets to harden verify unset again and a container's PATH, and the work-dir files a
play writes kept as the agent left them (`solution_files`). What it cannot reproduce: our backends end every process
of the agent's before verify and empty the verifier directory at the hand-over, so lingering and pre-written reward
plays are not admitted in this column even where Harbor would admit them.

ours: our default grading, the grader's box (`fresh`); everything else as the task declares."""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from opencode_env.audit.plays import NOT_APPLICABLE, Play, PlayError
from opencode_env.wire import MAX_COMMAND_CHARS, MAX_COMMANDS, MAX_FILES, RolloutRequest

Layout = Literal["native", "ours"]
LAYOUTS: tuple[Layout, ...] = ("native", "ours")
TaskKind = Literal["harbor", "request"]

HARDENING = (
    "PYTHONSAFEPATH", "PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "GIT_DIR",
    "GIT_COMMON_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_COUNT",
)  # fmt: skip
"""The variables our grader sets on verify (grading/grader_env.py) that a harness without our hardening does not."""
PLAY_DONE = "[audit] play exited "
SURVEY_CHARS = MAX_COMMAND_CHARS - 100
MAX_KEEPS = 32
"""Paths one play keeps at most: what a hostile box prints in the survey cannot grow a request past its limits."""
MAX_KEPT_PATH = 512


CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""A container's PATH when its image sets none (Docker's default): a harness's verify finds programs there, where our
grader in the agent's box keeps only the directories the agent cannot write (grading/verify_path.py)."""


def unhardened(command: str) -> str:
    """`command` run with our grader's hardening variables unset and a container's PATH, as a harness without them
    would run it."""
    unset = " ".join(f"-u {name}" for name in HARDENING)
    return f"env {unset} PATH={CONTAINER_PATH} /bin/bash -c {shlex.quote(command)}"


def native(request: RolloutRequest, keeps: Sequence[str] = ()) -> RolloutRequest:
    """ValueError (pydantic's) when the task's verify commands, unhardened, no longer fit a request."""
    kept = [*request.solution_files, *(path for path in keeps if path not in request.solution_files)]
    fields = request.model_dump()
    fields.update(
        verify_sandbox="same",
        verify_as="root",
        verify=[unhardened(command) for command in request.verify],
        solution_files=kept[:MAX_FILES],
    )
    return RolloutRequest.model_validate(fields)


def ours(request: RolloutRequest) -> RolloutRequest:
    return request.model_copy(update={"verify_sandbox": "fresh"})


def in_layout(request: RolloutRequest, layout: Layout, keeps: Sequence[str] = ()) -> RolloutRequest:
    return native(request, keeps) if layout == "native" else ours(request)


def play_command(play: Play) -> str:
    """The play as one solution command: its script in a subshell (its `exit` ends only the play), then its exit
    status printed, so a failing play never fails the run and its status is in the evidence."""
    return f'( {play.script}\n) ; echo "{PLAY_DONE}$?"'


def survey_commands(plays: Sequence[Play]) -> list[str]:
    """Read-only: for each play, whether the box offers what it needs and the paths it would keep, packed into as few
    solution commands as fit a command's limit. Each always exits 0."""
    commands: list[str] = []
    current = ""
    for play in plays:
        keeps = f"( {play.keeps}\n) 2>/dev/null | sed 's|^|KEEP {play.name} |'" if play.keeps else ":"
        test = f"( {play.applies}\n) >/dev/null 2>&1 < /dev/null"
        line = f"if {test}; then echo 'APPLIES {play.name}'; {keeps}; fi\n"
        if len(line) > SURVEY_CHARS:
            raise PlayError(
                f"{play.source}: applies and keeps of {play.name} take {len(line)} characters, over {SURVEY_CHARS}"
            )
        if len(current) + len(line) > SURVEY_CHARS:
            commands.append(current + "true")
            current = ""
        current += line
    commands.append(current + "true")
    if len(commands) > MAX_COMMANDS:
        raise PlayError(f"the plays' surveys need {len(commands)} commands, over a request's {MAX_COMMANDS}")
    return commands


@dataclass(frozen=True)
class Survey:
    applies: frozenset[str]
    keeps: dict[str, tuple[str, ...]]


def parse_survey(stdout: str) -> Survey:
    """The survey's lines (anything else is ignored; a kept path must stay in the work dir)."""
    applies: set[str] = set()
    keeps: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "APPLIES" and rest:
            applies.add(rest.strip())
        elif word == "KEEP":
            name, _, path = rest.partition(" ")
            normal = posixpath.normpath(path.strip())
            inside = path.strip() and not normal.startswith(("/", "..")) and normal != "."
            if inside and "\x00" not in normal and len(normal) <= MAX_KEPT_PATH:
                keeps.setdefault(name, []).append(normal)
    kept = {name: tuple(dict.fromkeys(paths))[:MAX_KEEPS] for name, paths in keeps.items()}
    return Survey(frozenset(applies), kept)


def play_exit(stdout: str) -> int | None:
    """The play's own exit status, from the line play_command prints (None when it never got there)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PLAY_DONE):
            rest = line.removeprefix(PLAY_DONE).strip()
            return int(rest) if rest.isdigit() else None
    return None


def found_nothing(stdout: str) -> bool:
    return play_exit(stdout) == NOT_APPLICABLE
