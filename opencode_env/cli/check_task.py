"""`opencode-env check-task TASK_DIR|TASK.json`: run a task's oracle and a do-nothing agent, print the verdict."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.cli.endings import say
from opencode_env.cli.support import announce_image_work, image_progress_to_stderr, needs
from opencode_env.rollout.check_task import EXIT_CODES, check_task
from opencode_env.sandbox import make_backend
from opencode_env.sandbox.local.data_dir import DataError, read_data_file
from opencode_env.sandbox.registry import EMBEDDED, backend_names
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.bounded_parse import REQUEST_FILE, ParseLimit, loads_json

MAX_DOCKERFILE_BYTES = 1 << 20


def _line(name: str, result: RolloutResult) -> str:
    return f"{name:<12}reward {result.reward} ({result.status}, {result.reward_source}) in {result.wall_s:.1f}s"


def _warn_network_steps(task: Path) -> None:
    """Task images are built offline: each Dockerfile step that looks like it needs the network, said before the
    build fails on it."""
    from opencode_env.sandbox.local.build.hints import OFFLINE_HINT, network_steps
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


def _task_request(task: Path) -> RolloutRequest:
    """A Harbor task directory's request with its solution (its image built now if it has none yet), or a TASK.json."""
    if task.is_dir():
        from opencode_env.tasks.harbor import request_from_task_dir

        say(f"opencode-env check-task: reading {task} (its image is built now if it has none yet)")
        _warn_network_steps(task)
        return request_from_task_dir(task, oracle=True, progress=image_progress_to_stderr)
    from opencode_env.tasks import TaskFormatError

    try:
        text = read_data_file(task, REQUEST_FILE.max_chars).decode("utf-8")
        fields = loads_json(text, where=str(task), limits=REQUEST_FILE)
    except ParseLimit as error:
        raise TaskFormatError(str(error)) from None
    except (json.JSONDecodeError, UnicodeDecodeError, DataError) as error:
        raise TaskFormatError(f"{task}: not a JSON request: {error}") from None
    return RolloutRequest.model_validate(fields)


def _cmd_check_task(args: argparse.Namespace) -> int:
    from opencode_env.sandbox.local.build import ImageBuildError
    from opencode_env.sandbox.local.build.hints import missing_base_hint
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
    try:
        check = asyncio.run(check_task(request, announce_image_work(make_backend(args.backend))))
    except ValueError as error:
        print(f"opencode-env check-task: {args.task}: {error}", file=sys.stderr)
        return 2
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "oracle.json").write_text(check.oracle.model_dump_json(indent=2))
        (args.save / "do-nothing.json").write_text(check.nothing.model_dump_json(indent=2))
    print(_line("oracle:", check.oracle))
    print(_line("do-nothing:", check.nothing))
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
    check.set_defaults(handler=_cmd_check_task)
