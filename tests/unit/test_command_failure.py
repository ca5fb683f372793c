"""Why a setup or solution command failed, in the words the user reads: a command that never started because its
working directory was missing says so (not 'the task is unsolvable'), any other says its last line on stderr."""

from __future__ import annotations

from opencode_env.rollout.commands import command_failure
from opencode_env.wire import CommandResult


def _ran(stderr: str, exit_code: int | None = 1) -> list[CommandResult]:
    timed_out = exit_code is None
    return [
        CommandResult(cmd="true", exit_code=0),
        CommandResult(cmd="bash /solution/solve.sh", exit_code=exit_code, stderr=stderr, timed_out=timed_out),
    ]


def test_a_missing_work_dir_is_named() -> None:
    for stderr in (
        "nsenter: cannot open current working directory: No such file or directory\n",
        "nsenter: cannot change directory to /app: No such file or directory\n",
        "seccomp_exec: the working directory /app is not in the task's root: No such file or directory\n",
    ):
        message = command_failure("solution command", _ran(stderr), "/app")
        assert message == (
            "solution command 2 exited 1: bash /solution/solve.sh: it never started, since the work dir /app does "
            "not exist in the sandbox"
        )


def test_the_task_saying_the_same_words_is_not_taken_for_it() -> None:
    stderr = "building...\nnsenter: cannot open current working directory\n"
    assert command_failure("setup command", _ran(stderr), "/app").endswith(
        "(stderr: nsenter: cannot open current working directory)"
    )


def test_otherwise_the_last_stderr_line_and_a_timeout() -> None:
    assert command_failure("setup command", _ran("a\nb: Permission denied\n\n"), "/app") == (
        "setup command 2 exited 1: bash /solution/solve.sh (stderr: b: Permission denied)"
    )
    assert command_failure("setup command", _ran("", exit_code=None), "/app") == (
        "setup command 2 timed out: bash /solution/solve.sh"
    )
