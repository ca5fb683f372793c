"""`opencode-env check-task TASK_DIR|TASK.json`: run a task's oracle and a do-nothing agent, print the verdict."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from opencode_env.cli.endings import say
from opencode_env.cli.extras import always
from opencode_env.cli.support import announce_image_work, image_progress_to_stderr, needs
from opencode_env.rollout.check_task import EXIT_CODES, check_task
from opencode_env.sandbox import make_backend
from opencode_env.sandbox.local.services import DataError, read_data_file
from opencode_env.sandbox.registry import EMBEDDED, backend_names
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.bounded_parse import REQUEST_FILE, ParseLimit, loads_json

if TYPE_CHECKING:
    from opencode_env.tasks.harbor import HarborTask

MAX_DOCKERFILE_BYTES = 1 << 20


def _line(name: str, result: RolloutResult) -> str:
    return f"{name:<12}reward {result.reward} ({result.status}, {result.reward_source}) in {result.wall_s:.1f}s"


def _warn_network_steps(task: Path) -> None:
    """Task images are built offline: each Dockerfile step that looks like it needs the network, said before the
    build fails on it."""
    from opencode_env.sandbox.local.services import OFFLINE_HINT, network_steps
    from opencode_env.tasks.task_files import TaskDir

    task_dir = TaskDir(task)
    if task_dir.kind("environment") != "dir" or task_dir.kind("environment/Dockerfile") != "file":
        return
    dockerfile = task_dir.read_bytes("environment/Dockerfile", MAX_DOCKERFILE_BYTES).decode(errors="replace")
    steps = network_steps(dockerfile)
    for number, line in steps:
        say(f"opencode-env check-task: warning: environment/Dockerfile line {number} needs the network? {line}")
    if steps:
        say(f"opencode-env check-task: {OFFLINE_HINT}")


def _warn(message: str) -> None:
    say(f"opencode-env check-task: warning: {message}")


def _warn_network_in_tests(task: HarborTask) -> None:
    """Most public test.sh install their tools at grading time (the uv installer, uvx, pip, apt-get): each line
    that looks like it, said with the network the sandbox will have."""
    from opencode_env.sandbox.local.services import network_steps, only_local_urls

    found = False
    local = task.local_names()
    for key, text in sorted(task.verify_files.items()):
        if key.endswith(".sh"):
            for number, line in network_steps(text):
                if only_local_urls(line, local):
                    continue
                found = True
                _warn(f"tests/{key.removeprefix('/tests/')} line {number} reaches the network? {line}")
    if found:
        have = "none but the model's" if task.config.network == "model_only" else "what this machine's egress reaches"
        _warn(
            f"verify has the sandbox's network ({have}): a test that cannot fetch what it installs grades the "
            "network, not the agent (the result's verify_network_failure says so); put its tools in the image "
            "(the base image has Python and pytest)"
        )


def _task_request(task: Path) -> RolloutRequest:
    """A Harbor task directory's request with its solution if it has one (its image built now if it has none yet),
    or a TASK.json. task.toml's unknown keys are an error here (a misspelt key would be ignored by a run)."""
    from opencode_env.tasks import TaskFormatError

    if task.is_dir():
        from opencode_env.tasks.harbor import HarborTask, request_from_task_dir

        say(f"opencode-env check-task: reading {task} (its image is built now if it has none yet)")
        harbor = HarborTask.from_dir(task)
        if harbor.unknown:
            raise TaskFormatError(f"{task / 'task.toml'}: {'; '.join(harbor.unknown)}")
        _warn_network_steps(task)
        _warn_network_in_tests(harbor)
        if not harbor.has_solution:
            _warn(f"{task / 'solution' / 'solve.sh'}: missing, so only doing nothing is run (no oracle)")
        return request_from_task_dir(task, oracle=harbor.has_solution, progress=image_progress_to_stderr, warn=_warn)

    try:
        text = read_data_file(task, REQUEST_FILE.max_chars).decode("utf-8")
        fields = loads_json(text, where=str(task), limits=REQUEST_FILE)
    except ParseLimit as error:
        raise TaskFormatError(str(error)) from None
    except (json.JSONDecodeError, UnicodeDecodeError, DataError) as error:
        raise TaskFormatError(f"{task}: not a JSON request: {error}") from None
    return RolloutRequest.model_validate(fields)


def _cmd_check_task(args: argparse.Namespace) -> int:
    from opencode_env.sandbox.local.services import ImageBuildError, missing_base_hint
    from opencode_env.tasks import TaskFormatError

    try:
        request = _task_request(args.task)
    except (TaskFormatError, ImageBuildError) as error:
        print(f"opencode-env check-task: {missing_base_hint(str(error))}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"opencode-env check-task: cannot read {args.task}: {error.strerror}", file=sys.stderr)
        return 2
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in error.errors())
        print(f"opencode-env check-task: {args.task} is not a valid task: {problems}", file=sys.stderr)
        return 2
    if request.solution is None and not args.task.is_dir():
        print(
            f"opencode-env check-task: {args.task}: solution: the task has none; add the reference solution's shell "
            "commands",
            file=sys.stderr,
        )
        return 2
    check = asyncio.run(check_task(request, announce_image_work(make_backend(args.backend))))
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        if check.oracle is not None:
            (args.save / "oracle.json").write_text(check.oracle.model_dump_json(indent=2))
        (args.save / "do-nothing.json").write_text(check.nothing.model_dump_json(indent=2))
    no_oracle = f"{'oracle:':<12}none (the task has no solution)"
    print(_line("oracle:", check.oracle) if check.oracle is not None else no_oracle)
    print(_line("do-nothing:", check.nothing))
    if check.choice is not None:
        other = f"; the other mode's oracle: {check.other_mode.reward}" if check.other_mode is not None else ""
        print(f"{'tests:':<12}{check.choice.mode} ({check.choice.reason}){other}")
    print(f"{'verdict:':<12}{check.verdict}: {check.reason}")
    for warning in check.warnings:
        print(f"{'warning:':<12}{warning}")
    return EXIT_CODES[check.verdict]


def add_check_task_parser(subparsers: Any) -> None:
    """Register `check-task` on the CLI's subparsers (argparse's private _SubParsersAction, hence Any)."""
    check = subparsers.add_parser(
        "check-task", help="run a task's oracle (must reach 1.0) and a do-nothing agent (must score below 1.0)"
    )
    check.add_argument(
        "task",
        type=Path,
        metavar="TASK_DIR_OR_JSON",
        help="a Harbor task directory (solution/solve.sh is its oracle) or a RolloutRequest in JSON with a solution",
    )
    where = f"where the two rollouts run ({needs(backend_names())})"
    check.add_argument("--backend", choices=backend_names(), default=EMBEDDED, help=where)
    check.add_argument("--save", type=Path, default=None, metavar="DIR", help="write both results as JSON here")
    check.set_defaults(handler=_cmd_check_task, runs_here=always)
