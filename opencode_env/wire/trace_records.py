"""The capture proxy's trace lines, parsed strictly: an unknown key or outcome is a problem reported, never a guess.

The proxy writes these (opencode_env/proxy/records.py, TraceWriter); a change there must change this file too. The
result a client reads is parsed leniently instead (opencode_env/models.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from opencode_env.wire.models import (
    PromptBase,
    PromptSource,
    RecordedOutcome,
    TokenIdSource,
    TopLogprob,
    TurnKind,
)


class ToolsRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["tools"]
    sha256: str = Field(min_length=64, max_length=64)
    tools: list[Any]


class DeliveryRecord(BaseModel):
    """A later word on a turn relayed whole: the agent's connection closed with some of its bytes unread."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["delivery"]
    turn: int = Field(ge=0)
    outcome: Literal["undelivered"]
    detail: str


class TurnRecord(BaseModel):
    """One model call, with its prompt ids compacted against an earlier record of the same trace."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["turn"]
    turn: int = Field(ge=0)
    timestamp: float = 0.0
    kind: TurnKind = "agent"
    headers: dict[str, str] = Field(default_factory=dict)
    stream: bool = True
    clamped: dict[str, Any] = Field(default_factory=dict)
    upstream_status: int | None = None
    outcome: RecordedOutcome = "complete"
    upstream_error: str | None = None
    latency_s: float = 0.0
    ttft_s: float | None = None
    finish_reason: str | None = None
    completion_tokens: list[str] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    per_token_logps: list[float] = Field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = Field(default_factory=list)
    response: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, int] = Field(default_factory=dict)
    token_id_source: TokenIdSource = "none"
    aligned: bool = False
    request: dict[str, Any] = Field(default_factory=dict)
    prompt_source: PromptSource = "chat_template"
    token_in_fallback: str | None = None
    template_fingerprint: str | None = None
    policy_version: str | None = None
    prompt_base: PromptBase | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)

    def turn_fields(self, prompt_ids: list[int]) -> dict[str, Any]:
        """The RolloutTurn fields, with the prompt ids already expanded to `prompt_ids`."""
        fields = self.model_dump(exclude={"type", "prompt_base", "prompt_token_ids"})
        fields["prompt_token_ids"] = prompt_ids
        return fields
