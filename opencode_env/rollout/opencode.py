"""OpenCode in a rollout: what a sandbox lacking it installs, the per-rollout config, the run command and its
event stream."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opencode_env.rollout.opencode_mcp import mcp_config
from opencode_env.sandbox.base import ProvidedTools
from opencode_env.wire import AGENT_ENV, OPENCODE_PACKAGE, OPENCODE_VERSION, PROXY_PYTHON_PACKAGES, ToolCallSummary
from opencode_env.wire.mcp import McpServer

__all__ = ["AGENT_ENV", "OPENCODE_PACKAGE", "OPENCODE_VERSION", "PROXY_PYTHON_PACKAGES"]

PROVIDER_ID = "rollout"
PROXY_MODEL_ALIAS = "policy"
MODEL_KEY_ENV_NAME = "OPENCODE_ENV_UPSTREAM_KEY"
"""The variable the capture proxy and OpenCode read their model key from, in environments we give them (the
operator's keys are settings: the endpoints' *_API_KEY)."""
DENIED_TOOLS = ("question", "webfetch", "task")
"""Denied by permission (OpenCode 1.18's `tools: {name: false}` is overridden by `permission: allow` and does not
turn them off): question needs a person, webfetch would fetch as OpenCode itself, task starts sub-agents."""
MODEL_KEY_REFERENCE = f"{{env:{MODEL_KEY_ENV_NAME}}}"
SUBSTITUTIONS = frozenset({MODEL_KEY_REFERENCE})
"""The only strings of our config OpenCode may substitute (`{env:NAME}`, `{file:PATH}`: it replaces them in the
config's text before parsing it, with its own environment and files): `config_text` escapes every other brace."""


PROJECT_CONFIG_NAMES = ("opencode.json", "opencode.jsonc", ".opencode")
"""What OpenCode 1.18.33 reads from the directory it runs in and each of its ancestors up to the repository's root
(or /): its config, and `.opencode/` with plugins, agents and commands. OPENCODE_DISABLE_PROJECT_CONFIG stops the
config loader but not the plugin loader (a plugin named there, or put in `.opencode/plugin/`, ran inside OpenCode
with the proxy token in its environment), so the host takes them out of the way before OpenCode starts: OpenCode
reads only the configuration we give it."""


def project_config_removal_command(workdir: str) -> str:
    """Remove OpenCode's project configuration from `workdir` and every ancestor, printing each path removed (a
    link is removed itself, never followed). Shell built-ins only but `rm`, for images without coreutils."""
    names = " ".join(PROJECT_CONFIG_NAMES)
    return (
        f'd={shlex.quote(workdir)}; while :; do for n in {names}; do p="${{d%/}}/$n"; '
        'if [ -e "$p" ] || [ -L "$p" ]; then rm -rf -- "$p" && printf \'%s\\n\' "$p"; fi; done; '
        '[ "$d" = / ] && break; d="${d%/*}"; [ -n "$d" ] || d=/; done'
    )


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
    *,
    base_url: str,
    model_id: str,
    max_tokens_cap: int,
    model_options: Mapping[str, Any],
    sub_agents: bool = False,
    store_dir: str = "",
    skills_dir: str | None = None,
    mcp_servers: Sequence[McpServer] = (),
) -> dict[str, Any]:
    """The OpenCode config for one rollout; the API key is referenced by env var, never written here. With
    `sub_agents`, the task tool is allowed (its child sessions' calls are attributed through OpenCode's store).
    `store_dir` (OpenCode's data dir) is denied to OpenCode's own file tools (read, write, edit run in its process,
    as its identity): the model cannot name its session store. `skills_dir`: a directory of skills OpenCode reads
    (its `skills.paths`). `mcp_servers`: the task's MCP servers (opencode_mcp.py)."""
    denied = [tool for tool in DENIED_TOOLS if not (sub_agents and tool == "task")]
    permission: dict[str, Any] = {"*": "allow", **dict.fromkeys(denied, "deny")}
    if store_dir:
        store = store_dir.rstrip("/")
        permission["external_directory"] = {"*": "allow", store: "deny", f"{store}/*": "deny"}
    model: dict[str, Any] = {"name": model_id, "limit": {"context": 262_144, "output": max_tokens_cap}}
    if model_options:
        model["options"] = dict(model_options)
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Rollout upstream",
                "options": {"baseURL": base_url, "apiKey": MODEL_KEY_REFERENCE},
                "models": {model_id: model},
            }
        },
        "model": f"{PROVIDER_ID}/{model_id}",
        "small_model": f"{PROVIDER_ID}/{model_id}",
        "permission": permission,
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "lsp": False,
        "formatter": False,
    }
    if skills_dir is not None:
        config["skills"] = {"paths": [skills_dir]}
    if mcp_servers:
        config["mcp"] = mcp_config(mcp_servers)
    return config


def config_text(config: Mapping[str, Any]) -> str:
    """The config as OpenCode's JSON, every `{` in a string escaped (\\u007b) but in SUBSTITUTIONS: OpenCode
    substitutes `{env:...}` and `{file:...}` in the text it reads, so a task's string (an MCP server's URL, a caller's
    model name) would otherwise read OpenCode's environment (its key) or its files."""
    return _json_text(config)


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        text = json.dumps(value)
        return text if value in SUBSTITUTIONS else text.replace("{", "\\u007b")
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_json_text(str(key))}: {_json_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_json_text(item) for item in value) + "]"
    return json.dumps(value)


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


def _unix_seconds(milliseconds: Any) -> float | None:
    """OpenCode stamps times in milliseconds since the epoch."""
    value = _int(milliseconds)
    return value / 1000 if value is not None and value > 0 else None


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
        times = state.get("time") if isinstance(state.get("time"), dict) else {}
        assert isinstance(times, dict)
        session = part.get("sessionID")
        events.tool_calls.append(
            ToolCallSummary(
                tool=str(part.get("tool", "")),
                status=str(state.get("status", "")),
                title=str(state.get("title", ""))[:200],
                exit_code=_int(metadata.get("exit")),
                started_at=_unix_seconds(times.get("start")),
                ended_at=_unix_seconds(times.get("end")),
                session_id=session[:200] if isinstance(session, str) else None,
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
