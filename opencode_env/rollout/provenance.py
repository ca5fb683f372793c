"""A rollout's provenance once its turns are in: the chat template checked call by call against the rollout's first,
and the hash of what configured the agent (OpenCode's effective config, its agents' system prompts, the tool list).

Pure: the pipeline hands it the result and the config it rendered.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from opencode_env.wire import RolloutResult, RolloutTurn
from opencode_env.wire.provenance import Provenance

TRAINED_KINDS = ("agent", "sub_agent")


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _without(value: Any, volatile: frozenset[str]) -> Any:
    """The config with this rollout's own values (the proxy's URL) blanked: equal configs hash equal across runs."""
    if isinstance(value, dict):
        return {key: _without(item, volatile) for key, item in value.items()}
    if isinstance(value, list):
        return [_without(item, volatile) for item in value]
    return "" if isinstance(value, str) and value in volatile else value


def config_parts(result: RolloutResult, config: dict[str, Any] | None, volatile: frozenset[str]) -> dict[str, str]:
    """The hash of each part: OpenCode's config, the system prompts its agents sent, the tool schemas sent."""
    messages = result.all_turn_messages()
    prompts = sorted(
        {
            json.dumps(turn_messages[0].get("content"), sort_keys=True, ensure_ascii=False)
            for turn, turn_messages in zip(result.proxy_turns, messages, strict=True)
            if turn.kind in TRAINED_KINDS
            and turn_messages
            and isinstance(turn_messages[0], dict)
            and turn_messages[0].get("role") == "system"
        }
    )
    parts = {"system_prompts": _digest(prompts), "tools": _digest(sorted(result.request_tools))}
    if config is not None:
        parts["config"] = _digest(_without(config, volatile))
    return parts


def template_changes(turns: list[RolloutTurn]) -> tuple[str | None, list[int]]:
    """The rollout's first fingerprint, and the turns whose fingerprint differs from it (each flagged)."""
    first = next((turn.template_fingerprint for turn in turns if turn.template_fingerprint), None)
    changed = []
    for turn in turns:
        turn.template_changed = first is not None and turn.template_fingerprint not in (None, first)
        if turn.template_changed:
            changed.append(turn.turn)
    return first, changed


def complete_provenance(result: RolloutResult, config: dict[str, Any] | None, volatile: frozenset[str]) -> None:
    """Fill the result's provenance from its turns and add a warning for each mismatch a trainer must see."""
    provenance = result.provenance or Provenance()
    result.provenance = provenance
    first, changed = template_changes(result.proxy_turns)
    provenance.template_fingerprint = first
    provenance.template_changed_turns = changed
    if changed:
        message = (
            f"the chat template changed during the rollout (fingerprint {first} at its first call): turns "
            f"{', '.join(map(str, changed))} were rendered by another template (flagged template_changed)"
        )
        result.warn("template_changed", message, severity="error")
    probed = provenance.endpoint.template_fingerprint if provenance.endpoint else None
    if first is not None and probed is not None and probed != first:
        message = f"the chat template changed since the endpoint was probed ({probed}, now {first})"
        result.warn("template_changed_since_probe", message)
    unfinite = [turn.turn for turn in result.proxy_turns if not all(map(math.isfinite, turn.per_token_logps))]
    if unfinite:
        message = (
            f"turns {', '.join(map(str, unfinite))} carry logprobs that are not finite (NaN or infinite: vLLM sends "
            "them as null): their tokens cannot be trained on as they are"
        )
        result.warn("logprobs_not_finite", message, severity="error")
    versions = sorted({turn.policy_version for turn in result.proxy_turns if turn.policy_version})
    if len(versions) > 1:
        message = f"the engine reported several policy versions in one rollout: {', '.join(versions)}"
        result.warn("policy_versions_mixed", message, severity="error")
    parts = config_parts(result, config, volatile)
    provenance.config_parts = parts
    provenance.config_sha256 = _digest(parts)
