"""OpenCode: the pinned version, its install, the per-rollout config, the run command and its event stream."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencode_env.models import ToolCallSummary
from opencode_env.sandbox.base import ProvidedTools

OPENCODE_VERSION = "1.18.33"
OPENCODE_PACKAGE = "opencode-ai"
PROVIDER_ID = "rollout"
PROXY_MODEL_ALIAS = "policy"
UPSTREAM_KEY_VAR = "OPENCODE_ENV_UPSTREAM_KEY"
DISABLED_TOOLS = ("question", "webfetch", "task")
AGENT_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}


class InstallError(Exception):
    """OpenCode could not be installed."""


def cache_root() -> Path:
    configured = os.environ.get("OPENCODE_ENV_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "opencode-env"


def _installed_prefix(binary: Path) -> Path:
    return binary.parents[2]


def _world_readable(prefix: Path) -> None:
    mode = prefix.stat().st_mode
    if mode & 0o055 != 0o055:
        prefix.chmod(mode | 0o055)


def _installed_binary(prefix: Path) -> Path:
    return prefix / "node_modules" / ".bin" / "opencode"


def install_cached(version: str = OPENCODE_VERSION, root: Path | None = None) -> Path:
    """Install OpenCode once per machine under the cache; concurrent callers wait on a file lock."""
    base = root or cache_root()
    prefix = base / f"opencode-{version}"
    binary = _installed_binary(prefix)
    if (prefix / ".complete").exists():
        return binary
    base.mkdir(parents=True, exist_ok=True)
    with (base / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (prefix / ".complete").exists():
            return binary
        if shutil.which("npm") is None:
            raise InstallError("npm is not installed; OpenCode is installed from the npm registry (Node >= 20).")
        staging = Path(tempfile.mkdtemp(prefix=f".opencode-{version}-", dir=base))
        completed = subprocess.run(
            ["npm", "install", "--no-fund", "--no-audit", "--prefix", str(staging), f"{OPENCODE_PACKAGE}@{version}"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if completed.returncode != 0 or not _installed_binary(staging).exists():
            shutil.rmtree(staging, ignore_errors=True)
            raise InstallError(f"npm install {OPENCODE_PACKAGE}@{version} failed: {completed.stderr[-2000:]}")
        shutil.rmtree(prefix, ignore_errors=True)
        staging.rename(prefix)
        (prefix / ".complete").write_text(version)
    return binary


async def cached_tools() -> ProvidedTools:
    """The tools the local backend provides: the cached OpenCode and this interpreter (for the proxy)."""
    import sys

    binary = await asyncio.to_thread(install_cached)
    # npm stages the install in a private temporary directory: sandbox users must be able to run what it holds.
    await asyncio.to_thread(_world_readable, _installed_prefix(binary))
    return ProvidedTools(
        opencode=str(binary), opencode_version=OPENCODE_VERSION, python=sys.executable, proxy_ready=True
    )


PROXY_PYTHON_PACKAGES = ("fastapi", "uvicorn", "uvloop", "httptools")


@dataclass(frozen=True)
class InstallStep:
    command: str
    privileged: bool


def install_commands(tools: ProvidedTools, *, proxy: bool) -> list[InstallStep]:
    """What a sandbox lacking our template needs before a rollout can run; each command is idempotent. The proxy's
    packages go where root's `python3 -E -s` (the proxy) finds them, so they are installed as root."""
    steps = []
    if not tools.opencode:
        steps.append(InstallStep(f"npm install -g --no-fund --no-audit {OPENCODE_PACKAGE}@{OPENCODE_VERSION}", False))
    if proxy and not tools.proxy_ready:
        steps.append(InstallStep("python3 -m pip install --quiet " + " ".join(PROXY_PYTHON_PACKAGES), True))
    return steps


def render_config(
    *, base_url: str, model_id: str, max_tokens_cap: int, model_options: Mapping[str, Any]
) -> dict[str, Any]:
    """The OpenCode config for one rollout; the API key is referenced by env var, never written here."""
    model: dict[str, Any] = {"name": model_id, "limit": {"context": 262_144, "output": max_tokens_cap}}
    if model_options:
        model["options"] = dict(model_options)
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Rollout upstream",
                "options": {"baseURL": base_url, "apiKey": f"{{env:{UPSTREAM_KEY_VAR}}}"},
                "models": {model_id: model},
            }
        },
        "model": f"{PROVIDER_ID}/{model_id}",
        "small_model": f"{PROVIDER_ID}/{model_id}",
        "permission": "allow",
        "autoupdate": False,
        "share": "disabled",
        "tools": dict.fromkeys(DISABLED_TOOLS, False),
    }


def run_command(
    *, opencode: str, workdir: str, instruction_path: str, events_path: str, stderr_path: str, title: str
) -> str:
    """`opencode run` with the instruction on stdin from a file (verbatim) and its exit code kept (no pipe); the
    title is attached to its flag, so a task id starting with '-' is never read as a flag of its own."""
    return (
        f"cd {shlex.quote(workdir)} && exec {shlex.quote(opencode)} run --format json --title={shlex.quote(title)}"
        f" < {shlex.quote(instruction_path)} > {shlex.quote(events_path)} 2> {shlex.quote(stderr_path)}"
    )


@dataclass
class AgentEvents:
    """What OpenCode's `--format json` event stream says about the run."""

    tool_calls: list[ToolCallSummary] = field(default_factory=list)
    final_text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0
    errors: list[str] = field(default_factory=list)
    unparsed_lines: int = 0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_events(text: str) -> AgentEvents:
    events = AgentEvents()
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            events.unparsed_lines += 1
            continue
        if not isinstance(event, dict):
            events.unparsed_lines += 1
            continue
        _apply_event(events, event)
    return events


def _apply_event(events: AgentEvents, event: dict[str, Any]) -> None:
    kind = event.get("type")
    part = event.get("part") if isinstance(event.get("part"), dict) else {}
    assert isinstance(part, dict)
    if kind == "tool_use":
        state = part.get("state") if isinstance(part.get("state"), dict) else {}
        assert isinstance(state, dict)
        metadata = state.get("metadata") if isinstance(state.get("metadata"), dict) else {}
        assert isinstance(metadata, dict)
        events.tool_calls.append(
            ToolCallSummary(
                tool=str(part.get("tool", "")),
                status=str(state.get("status", "")),
                title=str(state.get("title", ""))[:200],
                exit_code=_int(metadata.get("exit")),
            )
        )
    elif kind == "text":
        text = part.get("text")
        if isinstance(text, str) and text.strip():
            events.final_text = text
    elif kind == "step_finish":
        events.steps += 1
        tokens = part.get("tokens") if isinstance(part.get("tokens"), dict) else {}
        assert isinstance(tokens, dict)
        events.input_tokens += _int(tokens.get("input")) or 0
        events.output_tokens += _int(tokens.get("output")) or 0
    elif kind == "error":
        detail = event.get("error", part)
        events.errors.append(json.dumps(detail, ensure_ascii=False)[:2000])
