"""One model call as the capture proxy recorded it: its tokens, logprobs, prompt ids and request.

How a turn's prompt ids and messages are written on the wire (the "module doc" its field descriptions name) is
described in models.py's doc."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from opencode_env.wire.wire_float import WireFloat

TurnKind = Literal["agent", "auxiliary", "sub_agent", "unattributed"]
"""unattributed: a call the proxy cannot tie to OpenCode itself (kept in the record, never trained or counted)."""
TokenIdSource = Literal["return_token_ids", "token_id_strings", "none"]
PromptSource = Literal["chat_template", "token_in"]
"""How a turn's prompt ids were made: chat_template, the model server rendered the messages itself (every call);
token_in, the proxy sent the previous turn's prompt + completion ids followed by the new messages' ids."""
RecordedOutcome = Literal[
    "complete",
    "bad_request",
    "upstream_error",
    "stalled",
    "unreachable",
    "upstream_disconnected",
    "client_disconnected",
    "undelivered",
]
"""How a call ended, as the proxy recorded it."""
TurnOutcome = RecordedOutcome | Literal["cut_by_deadline"]
"""cut_by_deadline: the pipeline's word for a call our own deadline cut (the proxy saw the agent go away)."""

TopLogprob = tuple[str, WireFloat, int | None]
"""One alternative at a position: (token, logprob, token id when the upstream gave one)."""


class CallUsage(BaseModel):
    """What the model server counted for one call: OpenAI's usage object, its integer fields (others kept as sent).
    A count the server did not send is None, and left out of the JSON."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None

    @model_serializer(mode="wrap")
    def _counted_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, int]:
        return {name: value for name, value in handler(self).items() if value is not None}


class PromptBase(BaseModel):
    """The first `count` ids of (prompt ids + completion ids) of the turn numbered `turn`."""

    turn: int = Field(ge=0)
    count: int = Field(ge=1)


class MessagesBase(BaseModel):
    """The first `count` messages of the turn numbered `turn`."""

    turn: int = Field(ge=0)
    count: int = Field(ge=0)


class RolloutTurn(BaseModel):
    """One LLM call made by the agent, as recorded by the capture proxy."""

    turn: int
    finish_reason: str | None = None
    completion_tokens: list[str] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    per_token_logps: list[WireFloat] = Field(
        default_factory=list,
        description='One per completion token; -inf, inf and NaN travel as "-Infinity", "Infinity" and "NaN".',
    )
    latency_s: WireFloat = 0.0
    timestamp: WireFloat = 0.0
    upstream_status: int | None = None
    upstream_error: str | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = Field(default_factory=list)
    request: dict[str, Any] = Field(
        default_factory=dict,
        description="The request as sent upstream, compacted: `messages` holds only what follows `messages_base`; "
        "`tools` is left out (see tools_sha256). RolloutResult.turn_messages(i) rebuilds the messages.",
    )
    messages_base: MessagesBase | None = Field(None, description="Where request.messages continue from.")
    tools_sha256: str | None = Field(None, description="Key of this turn's tool schemas in request_tools.")
    prompt_base: PromptBase | None = Field(
        None, description="Wire only: the prompt starts with these ids of an earlier turn (see the module doc)."
    )
    prompt_suffix_ids: list[int] = Field(
        default_factory=list, description="Wire only: the prompt ids after prompt_base."
    )
    response: dict[str, Any] = Field(default_factory=dict)
    usage: CallUsage = Field(default_factory=CallUsage, description="The model server's counts for this call.")
    ttft_s: WireFloat | None = None
    kind: TurnKind = "agent"
    headers: dict[str, str] = Field(default_factory=dict)
    token_id_source: TokenIdSource = "none"
    aligned: bool = False
    stream: bool = True
    outcome: TurnOutcome = "complete"
    clamped: dict[str, Any] = Field(
        default_factory=dict,
        description="Request fields the proxy overrode before forwarding (e.g. n: 64 sent as 1), with the "
        "values the agent sent.",
    )
    session_id: str | None = Field(None, description="The OpenCode session that made the call (x-session-id).")
    parent_session_id: str | None = Field(
        None, description="For a sub-agent's call: the session that started it (OpenCode's own session store)."
    )
    prompt_source: PromptSource = Field(
        "chat_template", description="How the prompt ids were made (token_in mode: see RolloutRequest.token_in)."
    )
    token_in_fallback: str | None = Field(
        None, description="token_in mode: why this turn's prompt was rendered by the server instead (first turn, ...)."
    )
    template_fingerprint: str | None = Field(
        None, description="The chat template's fingerprint the server showed at this call (see wire/provenance.py)."
    )
    template_changed: bool = Field(
        False, description="This call's template fingerprint differs from the rollout's first: filter it out."
    )
    policy_version: str | None = Field(
        None, description="The policy version the engine reported for this call (the operator's header)."
    )

    @model_validator(mode="before")
    @classmethod
    def _lift_request_references(cls, data: Any) -> Any:
        """Version 1 kept `messages_base` and `tools_sha256` inside `request`: lift them into their fields."""
        if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
            return data
        request = data["request"]
        if "messages_base" not in request and "tools_sha256" not in request:
            return data
        lifted = dict(data)
        lifted["request"] = {k: v for k, v in request.items() if k not in ("messages_base", "tools_sha256")}
        for key in ("messages_base", "tools_sha256"):
            if lifted.get(key) is None:
                lifted[key] = request.get(key)
        return lifted
