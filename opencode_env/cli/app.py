"""`opencode-env`: run one rollout from the command line, or the demo against the built-in scripted model."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from opencode_env.cli.audit import add_audit_parser
from opencode_env.cli.check_task import add_check_task_parser
from opencode_env.cli.eval import add_eval_parser
from opencode_env.cli.export import add_export_parser
from opencode_env.cli.extras import always, refusal_for
from opencode_env.cli.image import add_image_parser
from opencode_env.cli.run import RUN_EPILOG, add_run_arguments, run_command
from opencode_env.cli.support import needs, progress_to_stderr, summarize
from opencode_env.cli.terminal import guard_terminal
from opencode_env.cli.view import add_view_parser
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import (
    AUTO,
    AUTO_RULE,
    backend_names,
    default_backend,
    reap_sandboxes,
    reapable_names,
)
from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.services import cache_root
from opencode_env.settings import settings_or_exit, warn_unknown_variables
from opencode_env.wire import OPENCODE_VERSION, VERSION, Sampling

SERVE_DESCRIPTION = """Serve run_rollout over HTTP: standard MCP (streamable HTTP) at /mcp (alias /mcp/stream) for
MCP clients, OpenEnv's /ws, /step and JSON-RPC at /mcp for OpenEnv clients, /health and /metadata.

Access token: set OPENCODE_ENV_TOKEN in the server's environment (never on the command line) and every route but
/health requires `Authorization: Bearer <token>` (OpenCodeEnv(token=...) or the same variable on the client side
sends it). Without a token only connections from this machine are served: others get 403 and the reason.
OPENCODE_ENV_ALLOW_UNAUTHENTICATED=1 serves everyone without a token (a trusted network only: the local backend
runs commands on this machine, E2B spends your account).

MAX_CONCURRENT_ENVS caps the rollouts running at once over every transport; calls beyond it wait for a slot."""


def _cache_dir() -> Path:
    return cache_root(settings_or_exit().cache)


def _add_serving_backend_argument(parser: argparse.ArgumentParser) -> None:
    help_text = f"where rollouts run ({needs(backend_names())}; {AUTO_RULE})"
    parser.add_argument("--backend", choices=[AUTO, *backend_names()], default=AUTO, help=help_text)


NEUTRAL_SAMPLING = Sampling(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)
"""The demo samples from the model's own distribution, and says so: its logprobs are the sampler's. It runs in
token-in mode against a scripted model that plays stock vLLM (forwarded prompt ids), and its summary's coverage line
shows how many of the agent's tokens the TRL row carries."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from opencode_env.scripted.demo import DEMO_VERIFY, demo_request
    from opencode_env.scripted.model import ScriptedModelServer
    from opencode_env.scripted.script import demo_script

    print("Starting the scripted model on loopback and running OpenCode in a local sandbox...", file=sys.stderr)
    with ScriptedModelServer(demo_script(), forwarded_ids="on") as model:
        proxied = args.mode != "black_box"
        sampling, token_in = (NEUTRAL_SAMPLING, "auto") if proxied else (None, "off")
        request = demo_request(model.base_url, mode=args.mode, sampling=sampling, token_in=token_in)
        result = asyncio.run(run_rollout(request, default_backend(settings_or_exit()), progress=progress_to_stderr))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(result.model_dump_json(indent=2))
    print(summarize(result))
    print(f"result:     {len(DEMO_VERIFY)} verify commands; full RolloutResult JSON in {path}")
    return 0 if result.status == "completed" and result.reward == 1.0 else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from opencode_env.server.app import main as serve

    serve(host=args.host, port=args.port, backend=args.backend)
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    """The MCP server over stdio, for desktop clients that launch a command; logs go to stderr."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from opencode_env.server.runtime import STDIO, Runtime

    settings = settings_or_exit().model_copy(update={"backend": args.backend})
    Runtime.build(settings, address=STDIO).mcp.run(transport="stdio", show_banner=False)
    return 0


def _cmd_build_template(args: argparse.Namespace) -> int:
    from opencode_env.sandbox.cloud import template

    if args.dry_run:
        print(template.dockerfile())
        return 0
    print(template.build(args.name, cpu_count=args.cpu, memory_mb=args.memory_mb))
    return 0


def _cmd_reap(args: argparse.Namespace) -> int:
    killed = asyncio.run(reap_sandboxes(args.backend, older_than_s=args.older_than * 60, settings=settings_or_exit()))
    for sandbox_id in killed:
        print(sandbox_id)
    print(f"killed {len(killed)} sandbox(es) older than {args.older_than} min", file=sys.stderr)
    return 0


def _cmd_caller_token(args: argparse.Namespace) -> int:
    from opencode_env.server.auth import caller_token, revoked_names, withdrawn
    from opencode_env.settings import variable

    settings = settings_or_exit()
    operator = settings.token.get_secret_value()
    if not operator:
        print(
            f"set the server's {variable('token')} in this environment: a caller token is derived from it",
            file=sys.stderr,
        )
        return 2
    if args.name in revoked_names(settings.revoked_callers):
        print(withdrawn(args.name), file=sys.stderr)
        return 2
    try:
        print(caller_token(operator, args.name))
    except ValueError as error:
        print(f"name: {error}", file=sys.stderr)
        return 2
    return 0


def _cmd_install(_: argparse.Namespace) -> int:
    from opencode_env.sandbox.local.services import install_cached, install_config_deps
    from opencode_env.wire import PLUGIN_PACKAGE

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
    add_run_arguments(run)
    run.set_defaults(handler=run_command, runs_here=always)
    demo = commands.add_parser("demo", help="a full rollout against the built-in scripted model (no API keys)")
    demo.add_argument("--mode", choices=["transparent_proxy", "black_box"], default="transparent_proxy")
    demo.add_argument("--output-dir", type=Path, default=Path("runs"))
    demo.set_defaults(handler=_cmd_demo, runs_here=always)
    serve = commands.add_parser(
        "serve",
        help="serve the MCP tool over HTTP (standard MCP at /mcp, OpenEnv's routes)",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen beyond loopback (set a token first)")
    serve.add_argument("--port", type=int, default=8000)
    _add_serving_backend_argument(serve)
    serve.set_defaults(handler=_cmd_serve, runs_here=always)
    mcp = commands.add_parser("mcp", help="serve the MCP tool over stdio (for desktop MCP clients)")
    _add_serving_backend_argument(mcp)
    mcp.set_defaults(handler=_cmd_mcp, runs_here=always)
    build = commands.add_parser("build-template", help="build the E2B template (OpenCode and the proxy baked in)")
    build.add_argument("--name", default="opencode-env")
    build.add_argument("--dry-run", action="store_true", help="print the equivalent Dockerfile and stop")
    build.add_argument("--cpu", type=int, default=2)
    build.add_argument("--memory-mb", type=int, default=2048)
    build.set_defaults(handler=_cmd_build_template, runs_here=always)
    reap = commands.add_parser("reap", help="kill cloud sandboxes tagged by opencode-env that outlived their rollout")
    reap.add_argument("--older-than", type=float, default=60.0, metavar="MIN")
    reapers = reapable_names()
    reap.add_argument("--backend", choices=reapers, default=reapers[0], help=f"whose sandboxes ({needs(reapers)})")
    reap.set_defaults(handler=_cmd_reap, runs_here=always)
    caller = commands.add_parser(
        "caller-token",
        help="print caller NAME's token for the server whose OPENCODE_ENV_TOKEN is in this environment",
        description="Derive caller NAME's token offline, as the server's POST /callers issues it: the caller sees only "
        "its own runs. Withdraw one by adding NAME to OPENCODE_ENV_REVOKED_CALLERS on the server.",
    )
    caller.add_argument("name", help="1-64 letters, digits, '_' or '-'")
    caller.set_defaults(handler=_cmd_caller_token)
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
    add_audit_parser(commands)
    return parser


def _cmd_settings(args: argparse.Namespace) -> int:
    from opencode_env.settings import effective, markdown_table

    if args.markdown:
        print(markdown_table())
        return 0
    rows = effective(settings_or_exit())
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {value or '-'}  ({source})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    guard_terminal()
    args = build_parser().parse_args(argv)
    warn_unknown_variables()
    refusal = refusal_for(args)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    try:
        code: int = args.handler(args)
    except SandboxError as error:
        print(f"opencode-env: {error}", file=sys.stderr)
        return 2
    return code
