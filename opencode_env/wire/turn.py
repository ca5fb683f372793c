"""One model call as the capture proxy recorded it: its tokens, logprobs, prompt ids and request.

How a turn's prompt ids and messages are written on the wire (the "module doc" its field descriptions name) is
described in result.py's doc.

The capture proxy's trace lines (`TurnRecord`, `ToolsRecord`, `DeliveryRecord`) are parsed here strictly: an unknown
key or outcome is a problem reported, never a guess. The proxy writes these (opencode_env/proxy/records.py,
TraceWriter); a change there must change them too. The result a client reads is parsed leniently instead.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from opencode_env.wire.shared import WireFloat
from opencode_env.wire.token_packing import PackedTokens, ResultTexts, pack, unpack

TurnKind = Literal["agent", "auxiliary", "sub_agent", "unattributed"]
"""unattributed: a call the proxy's record cannot tie to one of OpenCode's sessions (kept in the record, never trained,
counted or deciding the rollout's status)."""
TokenIdSource = Literal["return_token_ids", "token_id_strings", "none"]
PromptSource = Literal["chat_template", "token_in", "forwarded_ids"]
"""How a turn's prompt ids were made: chat_template, the model server rendered the messages itself (every call);
token_in and forwarded_ids, the proxy sent the previous turn's prompt + completion ids followed by the new messages'
ids, on the token route (`/v1/chat/completions/tokens`, prime-rl's vLLM) or forwarded on the chat route
(`kv_transfer_params.prompt_token_ids`, stock vLLM) respectively."""
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


_PACKED_LISTS = ("completion_token_ids", "per_token_logps", "completion_tokens", "top_logprobs")


def unpacked_turn(data: Any, known: ResultTexts) -> Any:
    """A turn's wire form with its `packed` arrays back in the lists; `known`: the texts of the result's earlier
    turns (this turn's are added)."""
    if not isinstance(data, dict) or not data.get("packed"):
        return data
    packed = PackedTokens.model_validate(data["packed"])
    filled = [name for name in _PACKED_LISTS if data.get(name)]
    if filled:
        raise ValueError(f"packed and {', '.join(filled)} exclude each other")
    ids, logprobs, texts, top = unpack(packed, known)
    return {
        **data,
        "packed": None,
        "completion_token_ids": ids,
        "per_token_logps": logprobs,
        "completion_tokens": texts,
        "top_logprobs": top,
    }


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
    packed: PackedTokens | None = Field(
        None,
        description="Wire only (schema_version 4 to 6): completion_token_ids, per_token_logps, completion_tokens and "
        "top_logprobs packed as base64 little-endian arrays, those four lists then empty; see "
        "opencode_env/wire/token_packing.py for the layout. In Python the lists are always filled.",
    )

    @model_validator(mode="before")
    @classmethod
    def _unpack_tokens(cls, data: Any) -> Any:
        """A turn read on its own: its vocab and alt_texts hold every text it needs (RolloutResult unpacks its turns
        in order)."""
        return unpacked_turn(data, ResultTexts())

    def packed_for_wire(self, known: ResultTexts | None = None) -> RolloutTurn:
        """This turn with its per-token lists packed (itself when they cannot be, or are already); `known`: the
        texts earlier turns of its result carry (see token_packing)."""
        if self.packed is not None:
            return self
        packed = pack(self.completion_token_ids, self.per_token_logps, self.completion_tokens, self.top_logprobs, known)
        if packed is None:
            return self
        lists: dict[str, Any] = {name: [] for name in _PACKED_LISTS}
        return self.model_copy(update={**lists, "packed": packed})

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


class RefusedRecord(BaseModel):
    """A call the proxy refused before it reached the model (no valid token, or a socket OpenCode's uid does not
    own): `count` is the running total, the last line's the whole; the first lines name the caller."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["refused"]
    count: int = Field(ge=1)
    reason: Literal["no_token", "not_opencode"] | None = None
    client: str | None = None


class BudgetRecord(BaseModel):
    """The trace reached its size bound (`limit` bytes): no later call was recorded; `dropped` is the running count
    of calls left out, the last line's the whole."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["budget"]
    limit: int = Field(ge=1)
    dropped: int = Field(ge=1)


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
