"""`python -m opencode_env.proxy`: run the capture proxy on 127.0.0.1. The upstream key comes from an env var."""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import socket
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m opencode_env.proxy", description=__doc__)
    parser.add_argument("--upstream-url", required=True, help="OpenAI-compatible base URL, e.g. http://host/v1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    parser.add_argument("--port-file", default="", help="write the bound port here once listening")
    parser.add_argument("--trace", required=True, help="JSONL file the turns are appended to")
    parser.add_argument(
        "--max-file-bytes", type=int, default=0, help="no file this proxy writes (its trace, its log) passes this"
    )
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--max-tokens-cap", type=int, default=4096)
    parser.add_argument("--disable-thinking", action="store_true")
    parser.add_argument("--model-override", default="")
    parser.add_argument("--endpoint-kind", choices=["vllm", "openai", "hf_router", ""], default="")
    parser.add_argument("--idle-timeout", type=float, default=120.0, help="seconds without upstream bytes")
    parser.add_argument("--api-key-env", default="OPENCODE_ENV_UPSTREAM_KEY", help="env var holding the key")
    parser.add_argument("--max-unreachable", type=int, default=3, help="stop the agent after this many")
    parser.add_argument("--max-server-errors", type=int, default=20, help="stop the agent after this many 5xx")
    parser.add_argument("--listen-fd", type=int, default=-1, help="serve this inherited listening socket")
    parser.add_argument("--admin-socket", default="", help="also serve on this unix socket (health, drain)")
    parser.add_argument("--token-env", default="", help="env var holding the bearer token every caller must send")
    parser.add_argument("--upstream-address", default="", help="connect here instead of resolving the URL's host")
    parser.add_argument("--sampling", default="{}", help="JSON object of sampling parameters set on every call")
    parser.add_argument("--max-request-bytes", type=int, default=32 * 2**20, help="larger bodies get 413")
    parser.add_argument("--peer-table-fd", type=int, default=-1, help="an open /proc/<pid>/net/tcp of the callers")
    parser.add_argument(
        "--peer-uid",
        type=int,
        action="append",
        default=[],
        help="with --peer-table-fd: a uid that may call (repeatable)",
    )
    parser.add_argument(
        "--token-in",
        nargs="?",
        const="auto",
        default="",
        choices=["auto", "tokens", "forwarded", "none"],
        help="send agent turns' prompts as token ids: by the route the probe proved, or auto (each tried in turn)",
    )
    parser.add_argument("--token-in-unavailable", default="", help="with --token-in none: why, recorded per turn")
    parser.add_argument("--return-token-ids", choices=["auto", "on", "off"], default="auto", help="auto: vllm only")
    parser.add_argument("--template-check", action="store_true", help="fingerprint the chat template on every call")
    parser.add_argument("--policy-version-header", default="", help="record this response header per turn")
    return parser.parse_args(argv)


def listen(port: int, port_file: str) -> socket.socket:
    """Bind before the heavy imports: the agent can connect at once and waits in the backlog until we serve."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    if port_file:
        temporary = f"{port_file}.tmp"
        with open(temporary, "w") as handle:
            handle.write(str(listener.getsockname()[1]))
        os.replace(temporary, port_file)
    return listener


def listeners(args: argparse.Namespace) -> list[socket.socket]:
    inherited = args.listen_fd >= 0
    sockets = [socket.socket(fileno=args.listen_fd) if inherited else listen(args.port, args.port_file)]
    if args.admin_socket:
        admin = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        admin.bind(args.admin_socket)
        admin.listen(16)
        sockets.append(admin)
    return sockets


def bound_files(max_bytes: int) -> None:
    """The kernel's bound on every file this process writes (RLIMIT_FSIZE: a write past it fails with EFBIG, and
    Python ignores SIGXFSZ), below the trace writer's own budget: the log on stderr cannot grow past it either."""
    if max_bytes > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    bound_files(args.max_file_bytes)
    sockets = listeners(args)

    import uvicorn

    from opencode_env.proxy.app import create_app
    from opencode_env.proxy.delivery import delivery_aware_protocol
    from opencode_env.proxy.peers import PeerOwners
    from opencode_env.proxy.request import RewriteConfig
    from opencode_env.proxy.settings import ProxySettings

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    settings = ProxySettings(
        upstream_url=args.upstream_url.rstrip("/"),
        trace_path=args.trace,
        trace_max_bytes=args.max_file_bytes,
        api_key=os.environ.get(args.api_key_env, ""),
        rewrite=RewriteConfig(
            endpoint_kind=args.endpoint_kind,
            model_override=args.model_override,
            top_logprobs=args.top_logprobs,
            max_tokens_cap=args.max_tokens_cap,
            disable_thinking=args.disable_thinking,
            sampling=tuple(json.loads(args.sampling).items()),
            return_token_ids={"auto": None, "on": True, "off": False}[args.return_token_ids],
        ),
        idle_timeout_s=args.idle_timeout,
        access_token=os.environ.get(args.token_env, "") if args.token_env else "",
        max_unreachable=args.max_unreachable,
        max_server_errors=args.max_server_errors,
        max_request_bytes=args.max_request_bytes,
        upstream_address=args.upstream_address,
        peers=PeerOwners(args.peer_table_fd, frozenset(args.peer_uid)) if args.peer_table_fd >= 0 else None,
        token_in=args.token_in,
        token_in_unavailable=args.token_in_unavailable,
        template_check=args.template_check,
        policy_version_header=args.policy_version_header.lower(),
    )
    app = create_app(settings)
    protocol = delivery_aware_protocol(app.proxy.deliveries)
    config = uvicorn.Config(app, http=protocol, log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
