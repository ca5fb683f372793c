"""Where a rollout's data came from: what the endpoint could capture, which model and chat template answered, which
policy version and which agent configuration; a trainer reads these before trusting old data.

Every field has a default, so a result written before provenance existed still parses (its `provenance` is None).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Capture = Literal["tokens", "logprobs", "text"]
"""What a rollout needs from its endpoint. tokens: completion and prompt token ids and per-token logprobs (training);
logprobs: logprobs without ids; text: the reward only (evals). An endpoint that cannot give it is refused before any
sandbox starts."""
LogprobsKind = Literal["processed", "raw", "unknown"]
"""processed: the sampler's (temperature applied); raw: the model's unmodified distribution; unknown: not told."""
Observed = Literal["yes", "no", "unknown"]


class ModelIdentity(BaseModel):
    """The model as the server reports it in `/v1/models`."""

    id: str = ""
    root: str | None = Field(None, description="vLLM: the weights the served name points at (path or hub id).")
    max_model_len: int | None = Field(None, description="vLLM: the context length it serves.")
    owned_by: str | None = None


TokenInRoute = Literal["tokens", "forwarded", "none", "unknown"]
"""How the server takes a prompt as ids (opencode_env/proxy/token_in.py): tokens, prime-rl's
`/v1/chat/completions/tokens`; forwarded, `kv_transfer_params.prompt_token_ids` on the chat route (stock vLLM);
none, neither was proven; unknown, not probed for it."""


class TokenInSupport(BaseModel):
    """What the endpoint probe's two-turn token-in check found: turn 1 by the chat template, turn 2 sent as its
    prompt + completion ids and the rendered suffix by each route in turn, checked for the ids echoed back exactly
    and a tool call still parsed."""

    route: TokenInRoute = Field("unknown", description="The route the proxy uses: the first one proven.")
    tokens_route: str = Field("", description="What the token route answered ('' when not tried).")
    forwarded_ids: str = Field("", description="What the chat route with forwarded prompt ids answered.")
    suffix: str = Field(
        "", description="'rendered' when /tokenize gave the new messages' ids after the reply; else why not."
    )
    problem: str | None = Field(None, description="Why no route was proven (route 'none').")


class EndpointCapabilities(BaseModel):
    """What one small probe call showed the endpoint returns."""

    completion_token_ids: bool = False
    prompt_token_ids: bool = False
    logprobs: bool = False
    top_logprob_ids: bool = Field(False, description="The alternatives carry token ids too.")
    token_id_source: Literal["return_token_ids", "token_id_strings", "none"] = "none"
    return_token_ids: bool = Field(False, description="The server accepted the `return_token_ids` request field.")
    logprobs_kind: LogprobsKind = Field(
        "unknown", description="Compared at two temperatures: equal logprobs are raw, different ones processed."
    )
    tool_calls: Observed = Field("unknown", description="The model called a tool it was offered.")
    tools_refused: str | None = Field(
        None, description="The server's answer when it refused a request that offers tools (OpenCode's every call)."
    )
    token_in: TokenInSupport | None = Field(
        None, description="The two-turn token-in check (run for a request with token_in on); None when not run."
    )


class EndpointProbe(BaseModel):
    """The probe of the rollout's endpoint (cached per server, model and key for a while)."""

    probed: bool = Field(False, description="False: the endpoint did not answer the probe (see `problem`).")
    problem: str | None = Field(None, description="Why the probe could not tell (unreachable, refused, ...).")
    capabilities: EndpointCapabilities = Field(default_factory=EndpointCapabilities)
    model: ModelIdentity | None = None
    template_fingerprint: str | None = Field(
        None, description="The server's rendering of a fixed conversation (`/tokenize`), hashed; None without one."
    )
    probed_at: float = Field(0.0, description="Unix time of the probe.")
    cached: bool = Field(False, description="This rollout reused an earlier probe of the same endpoint.")
    cost_s: float = Field(0.0, description="Seconds the probe took (0 when cached).")


class Provenance(BaseModel):
    """What a trainer needs to trust a rollout's data without looking at it."""

    capture: Capture = Field("tokens", description="What the request asked of the endpoint.")
    endpoint: EndpointProbe | None = Field(None, description="The endpoint probe; None when none ran (oracle).")
    policy_version: str = Field("", description="The caller's label of the policy's weights for this rollout.")
    policy_version_header: str = Field(
        "", description="The response header the operator named as the engine's per-call policy version."
    )
    template_fingerprint: str | None = Field(
        None,
        description="The chat template's fingerprint at the rollout's first call; each turn is checked against it.",
    )
    template_changed_turns: list[int] = Field(
        default_factory=list, description="Turns whose template fingerprint differs from the rollout's first."
    )
    config_sha256: str | None = Field(
        None, description="Hash of OpenCode's effective config, its agents' system prompts and the tool list together."
    )
    config_parts: dict[str, str] = Field(
        default_factory=dict, description="The hash of each part of config_sha256: config, system_prompts, tools."
    )
