"""`opencode-env run`: one rollout from flags, a request file or a Harbor task directory; the result as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, cast, get_args

from pydantic import ValidationError

from opencode_env.cli.endings import Ending, run_until_signalled, say
from opencode_env.cli.support import (
    announce_image_work,
    image_progress_to_stderr,
    needs,
    progress_to_stderr,
    summarize,
)
from opencode_env.rollout.endpoints import SCRIPTED
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import (
    EMBEDDED,
    backend_names,
    make_backend,
)
from opencode_env.sandbox.local.services import DataError, read_data_file
from opencode_env.scripted.builtin import solving_script
from opencode_env.scripted.script import Script
from opencode_env.settings import settings_or_exit
from opencode_env.wire import Capture, Phase, RolloutRequest, RolloutResult
from opencode_env.wire.bounded_parse import REQUEST_FILE, ParseLimit, loads_json
from opencode_env.wire.request import request_problems

RUN_EPILOG = """The request is built from --request FILE.json (a whole RolloutRequest, as `check-task` reads it), or
from --instruction / --instruction-file, or from --task DIR; each flag given beside it replaces that field (--file
and --verify-file add paths, replacing those the request already has). A field no one sets keeps the request's own
default. The API key comes from --api-key-env VAR, else from the request file if it holds one, else from the
endpoint's variables on this machine; it is never printed. With --solution (or a request file holding a
`solution`) the commands run in place of the agent: an oracle run, which needs no model."""


FILE_FLAGS = {"files": "--file", "verify_files": "--verify-file"}
"""The flags that add files to the request; every other flag whose dest is a request field sets that field."""


class RunArgumentError(Exception):
    """A `run` flag that cannot be used as given; the message names the flag."""


def _sandbox_file(value: str) -> tuple[str, str]:
    """An argparse type for `PATH=LOCALFILE`: (PATH, the local file's text); argparse names the flag on a failure."""
    path, equals, local = value.partition("=")
    if not equals or not path or not local:
        raise argparse.ArgumentTypeError(f"{value[:200]!r} is not PATH=LOCALFILE (a path in the sandbox=a file here)")
    return path, _read_text(Path(local))


def _read_text(path: Path) -> str:
    try:
        data = read_data_file(path, REQUEST_FILE.max_chars)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror or error}") from error
    except DataError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"{path} is not UTF-8 text (byte {error.start}): a request carries text files only"
        ) from error


def _text_argument(value: str) -> str:
    return _read_text(Path(value))


def _request_file(value: str) -> dict[str, Any]:
    """An argparse type for --request: the file's JSON object (validated as a request once the flags are merged)."""
    text = _read_text(Path(value))
    try:
        fields = loads_json(text, where=value, limits=REQUEST_FILE)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"{value} is not JSON: {error.msg} (line {error.lineno})") from error
    except ParseLimit as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not isinstance(fields, dict):
        raise argparse.ArgumentTypeError(f"{value} holds JSON {type(fields).__name__}, not a RolloutRequest object")
    return fields


def _script_file(value: str) -> Script:
    try:
        return Script.model_validate_json(_read_text(Path(value)))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise argparse.ArgumentTypeError(f"{value} is not a Script: {where}: {first['msg']}") from error


def _script_for(args: argparse.Namespace) -> Script | None:
    """The script of a `--model scripted` run that plays one: --script FILE, else a task dir's solve.sh; None: the
    built-in scripted model (model "scripted" with no base URL, see scripted/builtin.py)."""
    if args.model != SCRIPTED or args.base_url or args.endpoint:
        if args.script is not None:
            raise RunArgumentError("--script plays a script as the model: give it with --model scripted alone")
        return None
    if args.script is not None:
        return cast(Script, args.script)
    solve_sh = args.task / "solution" / "solve.sh" if args.task is not None else None
    if solve_sh is not None and solve_sh.is_file() and not args.oracle:
        return solving_script(_read_text(solve_sh))
    return None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    help_text = f"where the rollout runs ({needs(backend_names())})"
    parser.add_argument("--backend", choices=backend_names(), default=EMBEDDED, help=help_text)
    model = parser.add_argument_group("the model (or the VLLM_URL / OPENAI_* / HF_* variables of an --endpoint)")
    model.add_argument("--endpoint", choices=["vllm", "openai", "hf_router"], help="a named endpoint")
    model.add_argument("--base-url", help="an OpenAI-compatible base URL, e.g. http://gpu:8000/v1")
    model.add_argument("--model", help="the model id the endpoint serves")
    model.add_argument("--api-key-env", default="", metavar="VAR", help="name of the env var holding the API key")
    parser.add_argument(
        "--request", type=_request_file, metavar="FILE.json", help="a whole RolloutRequest as JSON; flags beside it win"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--instruction", help="the task for the agent")
    source.add_argument("--instruction-file", type=_text_argument, help="a file holding the task for the agent")
    source.add_argument("--task", type=Path, metavar="DIR", help="a Harbor task directory (its image built once)")
    parser.add_argument("--oracle", action="store_true", help="with --task: run its solution/solve.sh, no agent")
    parser.add_argument("--image", help="the sandbox's image (see RolloutRequest.image)")
    parser.add_argument("--workdir", help="the agent's work dir (default /home/user/workdir)")
    parser.add_argument("--setup", action="append", metavar="CMD", help="a setup command (repeat)")
    parser.add_argument("--verify", action="append", metavar="CMD", help="a verify command (repeat)")
    parser.add_argument(
        "--solution", action="append", metavar="CMD", help="a solution command (repeat): an oracle run, no model"
    )
    parser.add_argument(
        "--file",
        dest="files",
        action="append",
        type=_sandbox_file,
        metavar="PATH=LOCALFILE",
        help="write LOCALFILE's text to PATH in the sandbox before setup (relative to the work dir, or absolute)",
    )
    parser.add_argument(
        "--verify-file",
        dest="verify_files",
        action="append",
        type=_sandbox_file,
        metavar="PATH=LOCALFILE",
        help="a protected file written to PATH just before verify; the agent never sees it",
    )
    parser.add_argument("--task-id", help="your label for the task, echoed in the result")
    parser.add_argument("--mode", choices=["transparent_proxy", "black_box"], help="capture or not")
    parser.add_argument("--network", choices=["internet", "model_only"], help="the sandbox's way out")
    parser.add_argument(
        "--capture",
        choices=get_args(Capture),
        help="what the endpoint must return, checked before the sandbox starts (text: the reward only)",
    )
    parser.add_argument(
        "--agent-timeout", dest="agent_timeout_s", type=float, metavar="S", help="the agent's time limit"
    )
    parser.add_argument(
        "--setup-timeout", dest="setup_timeout_s", type=float, metavar="S", help="each setup command's limit"
    )
    parser.add_argument(
        "--verify-timeout", dest="verify_timeout_s", type=float, metavar="S", help="each verify command's limit"
    )
    parser.add_argument("--max-tokens-cap", type=int, metavar="N", help="max_tokens per model call")
    parser.add_argument("--top-logprobs", type=int, metavar="K", help="alternatives kept per token")
    parser.add_argument("--disable-thinking", action=argparse.BooleanOptionalAction, help="enable_thinking=false")
    parser.add_argument("--template", help="an E2B template (an alias of --image there)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the result JSON here instead of stdout")
    model.add_argument(
        "--script",
        type=_script_file,
        metavar="FILE.json",
        help="with --model scripted: the scripted model plays this Script (steps of replies and tool calls); "
        "without it, a --task DIR's solution/solve.sh is played, else the built-in behaviour (docs/scripted-model.md)",
    )


def _given_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields the flags set (None: not given); the API key from --api-key-env when given."""
    fields = {
        name: value
        for name, value in vars(args).items()
        if name in RolloutRequest.model_fields and name not in FILE_FLAGS and value is not None
    }
    if args.instruction_file is not None:
        fields["instruction"] = args.instruction_file
    if args.api_key_env:
        if args.api_key_env not in os.environ:
            raise RunArgumentError(f"--api-key-env names {args.api_key_env}, which is not set")
        fields["api_key"] = os.environ[args.api_key_env]
    return fields


def _with_files(fields: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """`fields` with the --file / --verify-file paths added (a path given twice is a mistake, not a choice)."""
    for name, flag in FILE_FLAGS.items():
        given: list[tuple[str, str]] = getattr(args, name) or []
        paths = [path for path, _ in given]
        twice = sorted({path for path in paths if paths.count(path) > 1})
        if twice:
            raise RunArgumentError(f"{flag} gives {', '.join(twice)} more than once")
        if given:
            fields[name] = {**(fields.get(name) or {}), **dict(given)}
    return fields


def _request_from_args(args: argparse.Namespace) -> RolloutRequest:
    given = _given_fields(args)
    if args.task is not None:
        if args.request is not None:
            raise RunArgumentError("--request and --task each give the whole task: give one")
        return _request_from_task(args, given)
    if args.oracle:
        raise RunArgumentError("--oracle runs a task directory's solution: give --task DIR (or --solution CMD)")
    if args.request is None and "instruction" not in given:
        raise RunArgumentError("say what to run: --instruction, --instruction-file, --task DIR or --request FILE.json")
    return RolloutRequest.model_validate(_with_files({**(args.request or {}), **given}, args))


def _request_from_task(args: argparse.Namespace, given: dict[str, Any]) -> RolloutRequest:
    from opencode_env.tasks.harbor import request_from_task_dir

    say(f"opencode-env run: reading {args.task}; its image is built now if it has none yet (minutes with RUN steps)")
    task = request_from_task_dir(args.task, oracle=args.oracle, progress=image_progress_to_stderr, **given)
    if not (args.files or args.verify_files):
        return task
    return RolloutRequest.model_validate(_with_files(task.model_dump(), args))


def run_command(args: argparse.Namespace) -> int:
    try:
        script = _script_for(args)
    except RunArgumentError as error:
        print(f"opencode-env run: {error}", file=sys.stderr)
        return 2
    if script is None:
        return _run(args)
    from opencode_env.scripted.model import ScriptedModelServer

    with ScriptedModelServer(script, model_name=SCRIPTED) as scripted:
        say(f"opencode-env run: the scripted model plays {len(script.steps)} step(s) at {scripted.base_url}")
        args.base_url = scripted.base_url
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from opencode_env.sandbox.local.services import ImageBuildError, missing_base_hint
    from opencode_env.tasks import TaskFormatError

    try:
        request = _request_from_args(args)
    except ValidationError as error:
        print(f"opencode-env: invalid request: {request_problems(error)}", file=sys.stderr)
        return 2
    except (TaskFormatError, ImageBuildError) as error:
        print(f"opencode-env: {missing_base_hint(str(error))}", file=sys.stderr)
        return 2
    except RunArgumentError as error:
        print(f"opencode-env run: {error}", file=sys.stderr)
        return 2
    result = RolloutResult()
    ending = Ending()

    def progress(phase: Phase, message: str) -> None:
        ending.phase = phase
        progress_to_stderr(phase, message)

    backend = announce_image_work(make_backend(args.backend, settings_or_exit()))
    run_until_signalled(run_rollout(request, backend, progress=progress, result=result), ending)
    if ending.received is not None:
        return _end_early(result, ending, args.out)
    if args.out is not None:
        args.out.write_text(result.model_dump_json(indent=2))
        print(summarize(result), file=sys.stderr)
    else:
        print(result.model_dump_json(indent=2))
    if result.status == "invalid_request":
        refusal = result.error or ""
        hint = " (on the command line: --base-url and --model, or --endpoint)" if "base_url" in refusal else ""
        hint += " (on the command line: --capture text)" if "capture='text'" in refusal else ""
        print(f"opencode-env run: {result.error}{hint}", file=sys.stderr)
        return 2
    if result.failed_phase == "validate":
        print(f"opencode-env run: {result.error}", file=sys.stderr)
    return 0 if result.status == "completed" else 1


def _end_early(result: RolloutResult, ending: Ending, out: Path | None) -> int:
    """The partial result (status cancelled, the phase it was in) to --out, else stdout, else, when the terminal is
    gone, to a file in the current directory; then one line saying where."""
    result.status, result.failed_phase = "cancelled", result.failed_phase or ending.phase
    result.error = f"the rollout was {ending.describe()}"
    text = result.model_dump_json(indent=2)
    where = _write_partial(text, out)
    say(f"opencode-env run: {ending.describe()}; the sandbox is closed; partial result {where}")
    return ending.exit_code


def _write_partial(text: str, out: Path | None) -> str:
    if out is not None:
        out.write_text(text)
        return f"in {out}"
    try:
        print(text, flush=True)
    except OSError:
        fallback = Path(f"opencode-env-run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json").resolve()
        fallback.write_text(text)
        return f"in {fallback} (stdout is closed)"
    return "on stdout"
