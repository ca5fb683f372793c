"""The records a result is made of besides its turns: command results, tool calls, attribution, usage, timings,
the upstream and the work-dir paths that are not UTF-8."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from opencode_env.wire.request import EndpointName
from opencode_env.wire.wire_float import WireFloat


class CommandResult(BaseModel):
    cmd: str
    exit_code: int | None = Field(description="None when the command was killed (timeout) before it exited.")
    stdout: str = ""
    stderr: str = ""
    duration_s: WireFloat = 0.0
    timed_out: bool = False
    output_truncated: bool = False


class ToolCallSummary(BaseModel):
    tool: str
    status: str
    title: str = ""
    exit_code: int | None = None
    started_at: WireFloat | None = Field(None, description="Unix time the tool started (OpenCode's event).")
    ended_at: WireFloat | None = Field(None, description="Unix time the tool ended (OpenCode's event).")
    session_id: str | None = Field(None, description="The OpenCode session whose step ran the tool.")


class AttributionCheck(BaseModel):
    """Each model call tied to the OpenCode session that made it, and the proxy's record checked against OpenCode's
    own session store (read from the host side once the agent has stopped): every assistant step OpenCode recorded
    should have a turn, and every agent or sub-agent turn a recorded step."""

    source: Literal["opencode_store", "headers_only"] = Field(
        "headers_only",
        description="opencode_store: sessions and their parents from OpenCode's database; headers_only: the store "
        "could not be read (see note), so the first session named is OpenCode's and any other is unattributed.",
    )
    sessions: int = Field(0, description="Sessions OpenCode recorded (the root and its sub-agents).")
    sub_agent_sessions: int = 0
    steps_recorded: int = Field(0, description="Assistant steps (model calls that answered) in OpenCode's store.")
    turns_matched: int = Field(0, description="Complete agent and sub-agent turns matched to a recorded step.")
    disagreements: list[str] = Field(default_factory=list, description="Steps without a turn, turns without a step.")
    note: str | None = Field(None, description="Why the store was not used, when it was not.")


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    source: Literal["proxy", "opencode_events", "none"] = "none"


class PhaseTimings(BaseModel):
    """Seconds spent in each phase; None for a phase that never started."""

    sandbox_s: WireFloat | None = None
    install_s: WireFloat | None = None
    prepare_s: WireFloat | None = None
    setup_s: WireFloat | None = None
    proxy_s: WireFloat | None = None
    agent_s: WireFloat | None = None
    verify_s: WireFloat | None = None
    collect_s: WireFloat | None = None
    close_s: WireFloat | None = None


class UpstreamInfo(BaseModel):
    """Where the model calls went, without the key."""

    endpoint: EndpointName = ""
    base_url: str = ""
    model: str = ""
    disable_thinking: bool = False


class NonUtf8Path(BaseModel):
    """A work-dir path whose bytes are not valid UTF-8 (Linux names are bytes; JSON text cannot hold them as such)."""

    path_base64: str = Field(
        description="The path's exact bytes, relative to the work dir ('/' between components), in standard padded "
        "base64 (RFC 4648): the one lossless form."
    )
    display: str = Field(
        description="For reading only: the path decoded as UTF-8 with each byte that is not UTF-8 written as \\xNN "
        "(not unique: a UTF-8 name may read the same)."
    )
