"""`opencode-env`: run one rollout from the command line, or the demo against the built-in scripted model."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.evals.cli import add_eval_parser
from opencode_env.rollout.check_task import add_check_task_parser
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import (
    AUTO,
    AUTO_RULE,
    BACKENDS,
    EMBEDDED,
    backend_names,
    default_backend,
    make_backend,
    reap_sandboxes,
    reapable_names,
)
from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.image_cli import add_image_parser
from opencode_env.sandbox.local.tools import cache_root
from opencode_env.settings import Settings
from opencode_env.training.export import add_export_parser
from opencode_env.viewer.cli import add_view_parser
from opencode_env.wire.models import Phase, RolloutRequest, RolloutResult, Sampling
from opencode_env.wire.pins import OPENCODE_VERSION
from opencode_env.wire.summary import result_summary
from opencode_env.wire.version import VERSION

SERVE_DESCRIPTION = """Serve run_rollout over HTTP: standard MCP (streamable HTTP) at /mcp (alias /mcp/stream) for
MCP clients, OpenEnv's /ws, /step and JSON-RPC at /mcp for OpenEnv clients, /health and /metadata.

Access token: set OPENCODE_ENV_TOKEN in the server's environment (never on the command line) and every route but
/health requires `Authorization: Bearer <token>` (OpenCodeEnv(token=...) or the same variable on the client side
sends it). Without a token only connections from this machine are served: others get 403 and the reason.
OPENCODE_ENV_ALLOW_UNAUTHENTICATED=1 serves everyone without a token (a trusted network only: the local backend
runs commands on this machine, E2B spends your account).

MAX_CONCURRENT_ENVS caps the rollouts running at once over every transport; calls beyond it wait for a slot."""


def _settings() -> Settings:
    """The operator's settings, loaded once by the command that needs them; a refused one ends it with its name."""
    try:
        return Settings.load()
    except ValidationError as error:
        print(f"opencode-env: a setting is refused: {error}", file=sys.stderr)
        raise SystemExit(2) from error


def _cache_dir() -> Path:
    return cache_root(_settings().cache)


def _progress(phase: Phase, message: str) -> None:
    print(f"[{phase}] {message}", file=sys.stderr, flush=True)


def summarize(result: RolloutResult) -> str:
    """The result's summary, then what a trainer must know: how much of the agent's tokens each export carries, and
    the result's warnings."""
    from opencode_env.training.sequences import training_summary

    lines = [result_summary(result)]
    coverage = training_summary(result).coverage if result.proxy_turns else None
    if coverage is not None:
        lines.append(f"coverage:   {coverage.text()}")
    lines += [f"warning:    {warning}" for warning in result.warnings]
    return "\n".join(lines)


def _needs(names: Sequence[str]) -> str:
    return "; ".join(f"{name} needs {BACKENDS[name].needs}" for name in names)


def _add_serving_backend_argument(parser: argparse.ArgumentParser) -> None:
    help_text = f"where rollouts run ({_needs(backend_names())}; {AUTO_RULE})"
    parser.add_argument("--backend", choices=[AUTO, *backend_names()], default=AUTO, help=help_text)


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
        data = path.read_bytes()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror or error}") from error
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
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"{value} is not JSON: {error.msg} (line {error.lineno})") from error
    if not isinstance(fields, dict):
        raise argparse.ArgumentTypeError(f"{value} holds JSON {type(fields).__name__}, not a RolloutRequest object")
    return fields


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    help_text = f"where the rollout runs ({_needs(backend_names())})"
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

    task = request_from_task_dir(args.task, oracle=args.oracle, **given)
    if not (args.files or args.verify_files):
        return task
    return RolloutRequest.model_validate(_with_files(task.model_dump(), args))


def _validation_message(error: ValidationError) -> str:
    problems = [f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in error.errors()]
    return "invalid request: " + "; ".join(problems)


def _cmd_run(args: argparse.Namespace) -> int:
    from opencode_env.tasks import ImageBuildError, TaskFormatError

    try:
        request = _request_from_args(args)
    except ValidationError as error:
        print(f"opencode-env: {_validation_message(error)}", file=sys.stderr)
        return 2
    except (TaskFormatError, ImageBuildError) as error:
        print(f"opencode-env: {error}", file=sys.stderr)
        return 2
    except RunArgumentError as error:
        print(f"opencode-env run: {error}", file=sys.stderr)
        return 2
    result = asyncio.run(run_rollout(request, make_backend(args.backend, _settings()), progress=_progress))
    if args.out is not None:
        args.out.write_text(result.model_dump_json(indent=2))
        print(summarize(result), file=sys.stderr)
    else:
        print(result.model_dump_json(indent=2))
    if result.status == "invalid_request":
        hint = (
            " (on the command line: --base-url and --model, or --endpoint)"
            if "base_url" in (result.error or "")
            else ""
        )
        print(f"opencode-env run: {result.error}{hint}", file=sys.stderr)
        return 2
    return 0 if result.status == "completed" else 1


NEUTRAL_SAMPLING = Sampling(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)
"""The demo samples from the model's own distribution, and says so: its logprobs are the sampler's."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from opencode_env.testing.demo import DEMO_VERIFY, demo_request
    from opencode_env.testing.script import demo_script
    from opencode_env.testing.scripted_model import ScriptedModelServer

    print("Starting the scripted model on loopback and running OpenCode in a local sandbox...", file=sys.stderr)
    with ScriptedModelServer(demo_script()) as model:
        sampling = None if args.mode == "black_box" else NEUTRAL_SAMPLING
        request = demo_request(model.base_url, mode=args.mode, sampling=sampling)
        result = asyncio.run(run_rollout(request, default_backend(_settings()), progress=_progress))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(result.model_dump_json(indent=2))
    print(summarize(result))
    print(f"result:     {len(DEMO_VERIFY)} verify commands; full RolloutResult JSON in {path}")
    return 0 if result.status == "completed" and result.reward == 1.0 else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from server.app import main as serve

    serve(host=args.host, port=args.port, backend=args.backend)
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    """The MCP server over stdio, for desktop clients that launch a command; logs go to stderr."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from server.runtime import Runtime

    settings = _settings().model_copy(update={"backend": args.backend})
    Runtime.build(settings).mcp.run(transport="stdio", show_banner=False)
    return 0


def _cmd_build_template(args: argparse.Namespace) -> int:
    from opencode_env.sandbox.cloud import template

    if args.dry_run:
        print(template.dockerfile())
        return 0
    print(template.build(args.name, cpu_count=args.cpu, memory_mb=args.memory_mb))
    return 0


def _cmd_reap(args: argparse.Namespace) -> int:
    killed = asyncio.run(reap_sandboxes(args.backend, older_than_s=args.older_than * 60, settings=_settings()))
    for sandbox_id in killed:
        print(sandbox_id)
    print(f"killed {len(killed)} sandbox(es) older than {args.older_than} min", file=sys.stderr)
    return 0


def _cmd_install(_: argparse.Namespace) -> int:
    from opencode_env.sandbox.local.tools import install_cached, install_config_deps
    from opencode_env.wire.pins import PLUGIN_PACKAGE

    cache = _cache_dir()
    print(f"OpenCode {OPENCODE_VERSION}: {install_cached(root=cache)}")
    deps = install_config_deps(root=cache)
    print(f"{PLUGIN_PACKAGE} {OPENCODE_VERSION} (for each rollout's config directory): {deps}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opencode-env", description=__doc__)
    parser.add_argument("--version", action="version", version=f"opencode-env {VERSION} (OpenCode {OPENCODE_VERSION})")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run one rollout and print the RolloutResult JSON",
        description="Run one rollout and print its RolloutResult JSON.",
        epilog=RUN_EPILOG,
    )
    _add_run_arguments(run)
    run.set_defaults(handler=_cmd_run)
    demo = commands.add_parser("demo", help="a full rollout against the built-in scripted model (no API keys)")
    demo.add_argument("--mode", choices=["transparent_proxy", "black_box"], default="transparent_proxy")
    demo.add_argument("--output-dir", type=Path, default=Path("runs"))
    demo.set_defaults(handler=_cmd_demo)
    serve = commands.add_parser(
        "serve",
        help="serve the MCP tool over HTTP (standard MCP at /mcp, OpenEnv's routes)",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen beyond loopback (set a token first)")
    serve.add_argument("--port", type=int, default=8000)
    _add_serving_backend_argument(serve)
    serve.set_defaults(handler=_cmd_serve)
    mcp = commands.add_parser("mcp", help="serve the MCP tool over stdio (for desktop MCP clients)")
    _add_serving_backend_argument(mcp)
    mcp.set_defaults(handler=_cmd_mcp)
    build = commands.add_parser("build-template", help="build the E2B template (OpenCode and the proxy baked in)")
    build.add_argument("--name", default="opencode-env")
    build.add_argument("--dry-run", action="store_true", help="print the equivalent Dockerfile and stop")
    build.add_argument("--cpu", type=int, default=2)
    build.add_argument("--memory-mb", type=int, default=2048)
    build.set_defaults(handler=_cmd_build_template)
    reap = commands.add_parser("reap", help="kill cloud sandboxes tagged by opencode-env that outlived their rollout")
    reap.add_argument("--older-than", type=float, default=60.0, metavar="MIN")
    reapers = reapable_names()
    reap.add_argument("--backend", choices=reapers, default=reapers[0], help=f"whose sandboxes ({_needs(reapers)})")
    reap.set_defaults(handler=_cmd_reap)
    install = commands.add_parser("install", help="install the pinned OpenCode into this machine's cache")
    install.set_defaults(handler=_cmd_install)
    settings = commands.add_parser(
        "settings", help="print every setting read from the environment, its value (secrets hidden) and its source"
    )
    settings.add_argument("--markdown", action="store_true", help="print the settings table as the README has it")
    settings.set_defaults(handler=_cmd_settings)
    add_export_parser(commands)
    add_view_parser(commands)
    add_check_task_parser(commands)
    add_image_parser(commands, _cache_dir)
    add_eval_parser(commands)
    return parser


def _cmd_settings(args: argparse.Namespace) -> int:
    from opencode_env.settings import effective, markdown_table

    if args.markdown:
        print(markdown_table())
        return 0
    rows = effective(_settings())
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {value or '-'}  ({source})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except SandboxError as error:
        print(f"opencode-env: {error}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
