"""The provenance columns every exported row carries, so a trainer can filter rows without opening the results:
the policy version, the chat template's fingerprint and the turns where it changed, the agent config's hash and the
model the server named."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from opencode_env.wire import RolloutResult


class ProvenanceColumns(BaseModel):
    policy_version: str = Field("", description="The caller's label of the policy for the rollout.")
    engine_policy_versions: list[str] = Field(
        default_factory=list, description="The versions the engine reported on the row's calls (operator's header)."
    )
    template_fingerprint: str = Field("", description="The chat template at the rollout's first call; '' unknown.")
    template_changed_turns: list[int] = Field(
        default_factory=list, description="The row's turns rendered by another template than the first: drop them."
    )
    config_sha256: str = Field("", description="OpenCode's config, agent prompts and tool list, hashed; '' unknown.")
    model_root: str = Field("", description="The weights the server named for the model (/v1/models); '' unknown.")


def provenance_columns(result: RolloutResult, turns: Iterable[int]) -> dict[str, object]:
    """The columns for a row made of `turns` (RolloutTurn.turn numbers) of `result`."""
    wanted = set(turns)
    chosen = [turn for turn in result.proxy_turns if turn.turn in wanted]
    provenance = result.provenance
    endpoint = provenance.endpoint if provenance else None
    columns = ProvenanceColumns(
        policy_version=provenance.policy_version if provenance else "",
        engine_policy_versions=sorted({turn.policy_version for turn in chosen if turn.policy_version}),
        template_fingerprint=(provenance.template_fingerprint if provenance else None) or "",
        template_changed_turns=[turn.turn for turn in chosen if turn.template_changed],
        config_sha256=(provenance.config_sha256 if provenance else None) or "",
        model_root=(endpoint.model.root if endpoint and endpoint.model else None) or "",
    )
    return dict(columns)
