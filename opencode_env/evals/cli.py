"""`opencode-env eval TASK_DIR_OR_FILE... --out DIR`: run every task k times, write each result as it finishes,
then summary.json, index.html and the summary table; a rerun into the same DIR resumes."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.evals.runner import EvalError, run_eval
from opencode_env.evals.summary import EvalSummary
from opencode_env.sandbox import EMBEDDED, backend_names, default_concurrency, make_backend
from opencode_env.wire import RolloutRequest

SERVER_CONCURRENCY = 4
EVAL_DESCRIPTION = """Run every task k times (at most --concurrency rollouts at once) in this process or on an
opencode-env server (--server; its token from OPENCODE_ENV_TOKEN), and write into DIR:
  eval.json                  the run's configuration (a rerun with another k or model is refused without --force)
  results/<task>/<n>.json    each attempt's RolloutResult, as soon as it finishes (and <n>.html, its page)
  summary.json, index.html   pass@1, pass@k, rewards, statuses, tokens and time, per task and overall

A task is a Harbor task directory (or a directory of them), a JSON file holding one RolloutRequest or a list of
them, or a .jsonl file holding one per line; a request's `solution` runs only with --oracle. A rerun into the same
DIR skips the attempts whose result is there; those that failed on our side run again with --retry-infra. Exit
status: 0 when every attempt has a result that is not an infrastructure failure, 1 when some failed on our side, 2
for a problem with the arguments, the tasks or DIR."""


def _task_id_from_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:@+/-]", "-", name)[:256] or "task"


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise EvalError(f"{where}: not JSON: {error}") from error


def _file_entries(path: Path) -> Iterator[tuple[str, str, Any]]:
    """(where, default task id, JSON value) of each request in a .json or .jsonl file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise EvalError(f"cannot read {path}: {error}") from error
    stem = _task_id_from_name(path.stem)
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                where = f"{path} line {number}"
                yield where, f"{stem}-{number}", _parse_json(line, where)
        return
    data = _parse_json(text, str(path))
    if isinstance(data, list):
        for index, item in enumerate(data):
            yield f"{path}[{index}]", f"{stem}-{index + 1}", item
    else:
        yield str(path), stem, data


def _for_this_run(where: str, request: RolloutRequest, *, oracle: bool) -> RolloutRequest:
    if oracle and request.solution is None:
        raise EvalError(f"{where}: task {request.task_id!r} has no solution to run with --oracle")
    return request if oracle else request.model_copy(update={"solution": None})


def _from_file(path: Path, *, oracle: bool) -> list[tuple[str, RolloutRequest]]:
    loaded = []
    for where, default_id, data in _file_entries(path):
        try:
            request = RolloutRequest.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            place = ".".join(str(part) for part in first["loc"]) or "(top level)"
            raise EvalError(f"{where}: not a RolloutRequest: {place}: {first['msg']}") from error
        if not request.task_id:
            request = request.model_copy(update={"task_id": default_id})
        loaded.append((where, _for_this_run(where, request, oracle=oracle)))
    return loaded


def _task_dirs(path: Path) -> list[Path]:
    """The task directory itself, or the task directories inside a dataset directory."""
    if (path / "task.toml").exists():
        return [path]
    inside = sorted(child for child in path.iterdir() if (child / "task.toml").is_file())
    return inside or [path]


def _from_task_dir(path: Path, *, oracle: bool) -> RolloutRequest:
    from opencode_env.tasks.harbor import request_from_task_dir
    from opencode_env.tasks.image_build import ImageBuildError

    try:
        request = request_from_task_dir(path, oracle=oracle)
    except (ValueError, OSError, ImageBuildError) as error:
        raise EvalError(f"{path}: {error}") from error
    return request if request.task_id else request.model_copy(update={"task_id": _task_id_from_name(path.name)})


def _load_path(path: Path, *, oracle: bool) -> list[tuple[str, RolloutRequest]]:
    if path.is_dir():
        return [(str(task_dir), _from_task_dir(task_dir, oracle=oracle)) for task_dir in _task_dirs(path)]
    if not path.exists():
        raise EvalError(f"{path}: no such file or directory")
    return _from_file(path, oracle=oracle)


def load_tasks(paths: Sequence[Path], *, oracle: bool = False) -> list[RolloutRequest]:
    """The requests of Harbor task directories (or directories of them) and JSON / JSONL files, in order; a request
    without a task id is named after its file. Requests' `solution` is kept with `oracle`, dropped without."""
    loaded = [entry for path in paths for entry in _load_path(path, oracle=oracle)]
    seen: dict[str, str] = {}
    for where, request in loaded:
        if request.task_id in seen:
            raise EvalError(f"task id {request.task_id!r} appears twice, in {seen[request.task_id]} and in {where}")
        seen[request.task_id] = where
    return [request for _, request in loaded]


def with_model(
    tasks: Sequence[RolloutRequest], *, endpoint: str = "", base_url: str = "", model: str = "", api_key: str = ""
) -> list[RolloutRequest]:
    """The tasks with each non-empty field given here in place of their own (validated again)."""
    overrides = {
        name: value
        for name, value in (("endpoint", endpoint), ("base_url", base_url), ("model", model), ("api_key", api_key))
        if value
    }
    if not overrides:
        return list(tasks)
    try:
        return [RolloutRequest.model_validate({**task.model_dump(), **overrides}) for task in tasks]
    except ValidationError as error:
        raise EvalError(f"the model options do not fit a request: {error.errors()[0]['msg']}") from error


def _api_key(variable: str) -> str:
    if not variable:
        return ""
    if variable not in os.environ:
        raise EvalError(f"--api-key-env names {variable}, which is not set")
    return os.environ[variable]


def _eval(args: argparse.Namespace) -> EvalSummary:
    tasks = load_tasks(args.inputs, oracle=args.oracle)
    key = _api_key(args.api_key_env)
    tasks = with_model(tasks, endpoint=args.endpoint, base_url=args.base_url, model=args.model, api_key=key)
    if args.ray:
        return asyncio.run(_on_ray(args, tasks))
    backend = None if args.server else make_backend(args.backend or EMBEDDED)
    concurrency = args.concurrency or (default_concurrency(backend) if backend else SERVER_CONCURRENCY)
    coroutine = run_eval(
        tasks,
        out=args.out,
        k=args.k,
        concurrency=concurrency,
        backend=backend,
        server=args.server,
        threshold=args.pass_threshold,
        retry_infra=args.retry_infra,
        force=args.force,
        inputs=[str(path) for path in args.inputs],
    )
    return asyncio.run(coroutine)


async def _on_ray(args: argparse.Namespace, tasks: list[RolloutRequest]) -> EvalSummary:
    """The eval on the Ray cluster at --ray (the opencode-env[ray] extra), each node's slots at once by default."""
    try:
        from opencode_env.cluster import ClusterError, RayRollouts
    except ImportError as error:
        raise EvalError(f"--ray needs the ray extra: pip install 'opencode-env[ray]' ({error})") from error
    try:
        async with RayRollouts(args.ray) as cluster:
            return await run_eval(
                tasks,
                out=args.out,
                k=args.k,
                concurrency=args.concurrency or cluster.slots,
                executor=cluster,
                threshold=args.pass_threshold,
                retry_infra=args.retry_infra,
                force=args.force,
                inputs=[str(path) for path in args.inputs],
            )
    except ClusterError as error:
        raise EvalError(str(error)) from error


def _cmd_eval(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.server, args.backend, args.ray))) > 1:
        print("opencode-env eval: --server, --backend and --ray exclude each other", file=sys.stderr)
        return 2
    try:
        summary = _eval(args)
    except EvalError as error:
        print(f"opencode-env eval: {error}", file=sys.stderr)
        return 2
    print(summary.table())
    print(f"index:      {args.out / 'index.html'}")
    return 1 if summary.overall.infrastructure_failures else 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_eval_parser(subparsers: Any) -> None:
    """Register `eval` on the CLI's subparsers (argparse's private _SubParsersAction, hence Any)."""
    parser = subparsers.add_parser(
        "eval",
        help="run tasks k times each, resumably, and summarize pass@k (results, summary.json, index.html in DIR)",
        description=EVAL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="+", type=Path, metavar="TASK_DIR_OR_FILE")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where results and the summary go")
    parser.add_argument("-k", type=_positive, default=8, help="attempts per task (default 8)")
    parser.add_argument(
        "--concurrency", type=_positive, default=None, metavar="N", help="rollouts at once (default: the backend's)"
    )
    parser.add_argument("--model", default="", help="the model every task calls (default: each request's)")
    parser.add_argument("--base-url", default="", help="the OpenAI-compatible base URL every task calls")
    parser.add_argument("--endpoint", choices=["vllm", "openai", "hf_router"], default="")
    parser.add_argument("--api-key-env", default="", metavar="VAR", help="name of the env var holding the API key")
    parser.add_argument("--server", default=None, metavar="URL", help="run on this opencode-env server")
    parser.add_argument("--ray", default=None, metavar="ADDRESS", help="run on this Ray cluster ('auto': this node's)")
    parser.add_argument("--backend", choices=backend_names(), default=None, help=f"in-process (default {EMBEDDED})")
    parser.add_argument("--oracle", action="store_true", help="run each task's solution instead of the agent")
    parser.add_argument(
        "--pass-threshold", type=float, default=1.0, metavar="R", help="an attempt succeeds at reward >= R (1.0)"
    )
    parser.add_argument("--retry-infra", action="store_true", help="run attempts that failed on our side again")
    parser.add_argument("--force", action="store_true", help="resume into a DIR made with another k or model")
    parser.set_defaults(handler=_cmd_eval)
