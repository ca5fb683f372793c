"""The capture proxy's life inside one sandbox: upload, start, wait for health, drain, read the trace."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.opencode import MODEL_KEY_ENV_NAME
from opencode_env.sandbox.base import (
    PROXY_TRACE_READ_BYTES,
    ProxyHandle,
    ProxyLaunch,
    RolloutSandbox,
    SandboxError,
    proxy_file_bytes,
)
from opencode_env.sandbox.output import tail_text
from opencode_env.settings import Settings
from opencode_env.wire import RolloutRequest
from opencode_env.wire.trace import Trace, parse_trace

LOG_LIMIT = 8192
DRAIN_WAIT_S = 15.0


class ProxyStartError(Exception):
    """The capture proxy did not come up; the message carries its log."""


def proxy_sources() -> dict[str, str]:
    """The proxy's package and the standalone code it reads (`inside`), uploaded as they are next to an empty
    `opencode_env` package."""
    package = Path(__file__).resolve().parents[1]
    files = {
        f"opencode_env/{folder}/{path.name}": path.read_text()
        for folder in ("proxy", "inside")
        for path in sorted((package / folder).glob("*.py"))
    }
    files["opencode_env/__init__.py"] = ""
    return files


def upstream_proxy_env(settings: Settings) -> dict[str, str]:
    """The operator's proxy settings (a corporate network) under reserved names: the capture proxy never reads the
    standard ones, which a caller's `env` could set where the proxy shares the sandbox's environment."""
    values = {"HTTPS_PROXY": settings.https_proxy, "HTTP_PROXY": settings.http_proxy, "NO_PROXY": settings.no_proxy}
    return {f"OPENCODE_ENV_{name}": value for name, value in values.items() if value}


def proxy_launch(python: str, upstream: Upstream, request: RolloutRequest, settings: Settings) -> ProxyLaunch:
    """The proxy's program and environment; the backend adds where it listens, its trace and its token."""
    args = [
        "--upstream-url",
        upstream.base_url,
        "--top-logprobs",
        str(request.top_logprobs),
        "--max-tokens-cap",
        str(request.max_tokens_cap),
        "--model-override",
        upstream.model,
        "--endpoint-kind",
        upstream.endpoint,
        "--idle-timeout",
        str(request.upstream_idle_timeout_s),
        "--api-key-env",
        MODEL_KEY_ENV_NAME,
        "--max-unreachable",
        str(request.upstream_max_unreachable),
        "--max-server-errors",
        str(request.upstream_max_server_errors),
        "--max-file-bytes",
        str(proxy_file_bytes(request.disk_mb)),
    ]
    if upstream.disable_thinking:
        args.append("--disable-thinking")
    if upstream.connect_address:
        args += ["--upstream-address", upstream.connect_address]
    if request.sampling is not None:
        args += ["--sampling", json.dumps(request.sampling.sent())]
    if request.token_in != "off":
        args += ["--token-in", upstream.token_in_route]
        if upstream.token_in_unavailable:
            args += ["--token-in-unavailable", upstream.token_in_unavailable]
    if upstream.return_token_ids is not None:
        args += ["--return-token-ids", "on" if upstream.return_token_ids else "off"]
    if upstream.template_check:
        args.append("--template-check")
    if settings.policy_version_header:
        args += ["--policy-version-header", settings.policy_version_header]
    env = {MODEL_KEY_ENV_NAME: upstream.api_key, "PYTHONDONTWRITEBYTECODE": "1", **upstream_proxy_env(settings)}
    return ProxyLaunch(python=python, args=tuple(args), env=env, sources=proxy_sources())


async def start_proxy(
    sandbox: RolloutSandbox, upstream: Upstream, request: RolloutRequest, settings: Settings, budget_s: float
) -> ProxyHandle:
    """Start the proxy; returns once it listens, before it is fully up (see wait_healthy)."""
    launch = proxy_launch(sandbox.tools.python or "python3", upstream, request, settings)
    try:
        return await asyncio.wait_for(sandbox.start_proxy(launch), timeout=budget_s)
    except TimeoutError as error:
        raise ProxyStartError("the capture proxy did not listen in time") from error
    except SandboxError as error:
        raise ProxyStartError(str(error)) from error


async def wait_healthy(proxy: ProxyHandle, budget_s: float) -> None:
    """Raise ProxyStartError unless the proxy answers /healthz within the budget; at once when it has exited (a
    proxy that is alive but slow, on a busy machine, is waited for: that is no failure of the infrastructure)."""
    answer = await proxy.call("/healthz", "GET", budget_s)
    if answer is None or answer.get("ok") is not True:
        log_tail = await proxy_log_tail(proxy)
        exited = not await proxy.running()
        await proxy.kill()
        if exited:
            raise ProxyStartError(f"the capture proxy exited at start: {log_tail or 'it wrote no log'}")
        raise ProxyStartError(f"the capture proxy did not answer /healthz: {log_tail}")


async def stop_proxy(proxy: ProxyHandle) -> None:
    """Wait for the records still being written, then stop the proxy."""
    if await proxy.running():
        await proxy.call("/drain", "POST", DRAIN_WAIT_S)
    await proxy.kill()


async def read_trace(proxy: ProxyHandle) -> Trace:
    """The turns as the proxy wrote them, from its own file (no task command can write there)."""
    text = (await proxy.read("trace.jsonl", PROXY_TRACE_READ_BYTES)).decode("utf-8", errors="replace")
    # Parsing a long trace takes milliseconds of CPU: off the event loop that every rollout of a server shares.
    return await asyncio.to_thread(parse_trace, text)


async def proxy_log_tail(proxy: ProxyHandle) -> str:
    return tail_text(await proxy.read("proxy.log", LOG_LIMIT), LOG_LIMIT)
