"""`opencode-env eval TASK_DIR_OR_FILE... --out DIR`: run every task k times, write each result as it finishes,
then summary.json, index.html and the summary table; a rerun into the same DIR resumes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from opencode_env.cli.endings import Ending, run_until_signalled, say
from opencode_env.cli.support import announce_image_work, image_progress_to_stderr
from opencode_env.client.client import OpenCodeEnv
from opencode_env.evals.inputs import load_each, with_model
from opencode_env.evals.runner import EvalError, EvalLayout, run_eval, write_summary
from opencode_env.evals.summary import EvalSummary
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox import EMBEDDED, backend_names, make_backend
from opencode_env.wire import RolloutRequest, Runner

EVAL_DESCRIPTION = """Run every task k times (at most --concurrency rollouts at once) in this process or on an
opencode-env server (--server; its token from OPENCODE_ENV_TOKEN), and write into DIR:
  eval.json                  the run's configuration (a rerun with another k or model is refused without --force)
  results/<task>/<n>.json    each attempt's RolloutResult, as soon as it finishes (and <n>.html, its page)
  summary.json, index.html   pass@1, pass@k, rewards, statuses, tokens and time, per task and overall

A task is a Harbor task directory, a JSON file holding one RolloutRequest or a list of them, or a .jsonl file
holding one per line; a folder gives its task directories and its .json / .jsonl files. A request's `solution` runs
only with --oracle. A rerun into the same DIR skips the attempts whose result is there; those that failed on our
side run again with --retry-infra. A broken input (a task directory whose image does not build, an entry that is
not a request, a .jsonl line by its number) is named with why on stderr, under the table, in summary.json and on
index.html, and the rest run; --fail-fast stops at the first instead. SIGTERM, Ctrl-C or a closed terminal end the eval:
the attempts running are cut short, their partial results written as results/<task>/<n>.cancelled.json, and the
same command resumes. Exit status: 0 when every task loaded and every attempt has a result that is not an
infrastructure failure, 1 when some failed on our side or a task was broken, 2 for a problem with the arguments or
DIR (or with a task, under --fail-fast), 128 + the signal's number when a signal ended it."""


def _api_key(variable: str) -> str:
    if not variable:
        return ""
    if variable not in os.environ:
        raise EvalError(f"--api-key-env names {variable}, which is not set")
    return os.environ[variable]


def _eval(args: argparse.Namespace, ending: Ending) -> tuple[EvalSummary | None, list[str]]:
    say(f"opencode-env eval: loading {len(args.inputs)} input(s)")
    loaded = load_each(
        args.inputs, oracle=args.oracle, fail_fast=args.fail_fast, report=say, image_progress=image_progress_to_stderr
    )
    for line in loaded.broken:
        say(f"opencode-env eval: broken task skipped: {line}")
    if not loaded.tasks:
        raise EvalError(f"no task to run: {len(loaded.broken)} broken, none loaded")
    say(f"opencode-env eval: {len(loaded.tasks)} task(s) to run, {len(loaded.broken)} broken")
    key = _api_key(args.api_key_env)
    tasks = with_model(loaded.tasks, endpoint=args.endpoint, base_url=args.base_url, model=args.model, api_key=key)
    return run_until_signalled(_on_runner(args, tasks), ending), loaded.broken


async def _on_runner(args: argparse.Namespace, tasks: list[RolloutRequest]) -> EvalSummary:
    runner = await open_runner(args)
    try:
        return await run_eval(
            tasks,
            out=args.out,
            k=args.k,
            runner=runner,
            concurrency=args.concurrency,
            threshold=args.pass_threshold,
            retry_infra=args.retry_infra,
            force=args.force,
            inputs=[str(path) for path in args.inputs],
        )
    finally:
        await runner.close()


async def open_runner(args: argparse.Namespace) -> Runner:
    """Where the eval runs, checked before any attempt: the Ray cluster at --ray (the opencode-env[ray] extra; each
    node's slots at once by default), the server at --server, or a backend in this process."""
    if args.ray:
        try:
            from opencode_env.cluster import ClusterError, RayRollouts
        except ImportError as error:
            raise EvalError(f"--ray needs the ray extra: pip install 'opencode-env[ray]' ({error})") from error
        cluster = RayRollouts(args.ray)
        try:
            await cluster.start()
        except ClusterError as error:
            raise EvalError(str(error)) from error
        return cluster
    if args.server:
        try:
            async with OpenCodeEnv(args.server):
                pass
        except ConnectionError as error:
            raise EvalError(f"cannot open a session on the server {args.server}: {error}") from error
        return OpenCodeEnv(args.server)
    return InProcess(announce_image_work(make_backend(args.backend or EMBEDDED)))


def _cmd_eval(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.server, args.backend, args.ray))) > 1:
        print("opencode-env eval: --server, --backend and --ray exclude each other", file=sys.stderr)
        return 2
    ending = Ending()
    try:
        summary, broken = _eval(args, ending)
    except EvalError as error:
        print(f"opencode-env eval: {error}", file=sys.stderr)
        return 2
    if summary is None:
        results = args.out / "results"
        saved = sum(1 for path in results.glob("*/*.json") if not path.name.endswith(".cancelled.json"))
        cut = sum(1 for _ in results.glob("*/*.cancelled.json"))
        say(
            f"opencode-env eval: {ending.describe()}; {saved} attempt(s) saved in {results}, {cut} cut short "
            "(their partial results in <n>.cancelled.json); the same command resumes"
        )
        return ending.exit_code
    if broken:
        summary = summary.model_copy(update={"broken": broken})
        write_summary(EvalLayout(args.out), summary)
    print(summary.table())
    print(f"index:      {args.out / 'index.html'}")
    if broken:
        print(f"broken:     {len(broken)} task(s) skipped (each named on stderr above)")
    return 1 if summary.overall.infrastructure_failures or broken else 0


def _runs_here(args: argparse.Namespace) -> bool:
    """On a server (--server) the rollouts run there; anywhere else they run in this process (or its Ray driver)."""
    return args.server is None


def positive(text: str) -> int:
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
    parser.add_argument("-k", type=positive, default=8, help="attempts per task (default 8)")
    parser.add_argument(
        "--concurrency", type=positive, default=None, metavar="N", help="rollouts at once (default: the backend's)"
    )
    parser.add_argument("--model", default="", help="the model every task calls (default: each request's)")
    parser.add_argument("--base-url", default="", help="the OpenAI-compatible base URL every task calls")
    parser.add_argument("--endpoint", choices=["vllm", "openai", "hf_router"], default="")
    parser.add_argument("--api-key-env", default="", metavar="VAR", help="name of the env var holding the API key")
    parser.add_argument("--server", default=None, metavar="URL", help="run on this opencode-env server")
    parser.add_argument("--backend", choices=backend_names(), default=None, help=f"in-process (default {EMBEDDED})")
    parser.add_argument("--ray", default=None, metavar="ADDRESS", help="run on this Ray cluster ('auto': this node's)")
    parser.add_argument("--oracle", action="store_true", help="run each task's solution instead of the agent")
    parser.add_argument(
        "--pass-threshold", type=float, default=1.0, metavar="R", help="an attempt succeeds at reward >= R (1.0)"
    )
    parser.add_argument("--retry-infra", action="store_true", help="run attempts that failed on our side again")
    parser.add_argument("--force", action="store_true", help="resume into a DIR made with another k or model")
    parser.add_argument(
        "--fail-fast", action="store_true", help="stop at the first broken task (default: report it and run the rest)"
    )
    parser.set_defaults(handler=_cmd_eval, runs_here=_runs_here)
