"""The capture decision and the provenance types, pure: what the endpoint probe's answer leads to before any sandbox
(tests/integration/test_provenance.py runs the probe and rollouts against a real model server)."""

from __future__ import annotations

import pytest

from opencode_env.rollout.preflight.probe import Decision, decide
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.provenance import EndpointCapabilities, EndpointProbe


def test_a_model_that_calls_no_tool_is_a_warning_that_does_not_blame_the_flags() -> None:
    """vLLM started with the tool flags and a model that answers text (a random-weights model, on 0.32)."""
    probe = EndpointProbe(
        probed=True,
        capabilities=EndpointCapabilities(
            completion_token_ids=True, prompt_token_ids=True, logprobs=True, tool_calls="no"
        ),
        template_fingerprint="sha256:0",
    )
    decision = decide(probe, "tokens", top_logprobs=5, shaped_sampling=False)
    assert decision.refusal is None
    [warning] = [notice.message for notice in decision.warnings]
    assert "did not call a tool" in warning
    assert "--tool-call-parser" in warning
    assert "start it with --enable-auto-tool-choice" not in warning


def messages(decision: Decision) -> list[str]:
    return [notice.message for notice in decision.warnings]


def test_the_decision_names_what_is_missing_and_warns_of_the_rest() -> None:
    openai_like = EndpointProbe(probed=True, capabilities=EndpointCapabilities(logprobs=True, logprobs_kind="raw"))
    refused = decide(openai_like, "tokens", top_logprobs=5, shaped_sampling=False)
    assert refused.refusal is not None
    assert "prompt token ids" in refused.refusal
    accepted = decide(openai_like, "logprobs", top_logprobs=5, shaped_sampling=True)
    assert accepted.refusal is None
    assert any("no token ids" in warning for warning in messages(accepted))
    assert any("processed_logprobs" in warning for warning in messages(accepted))
    unprobed = EndpointProbe(probed=False, problem="the endpoint did not answer the probe: ConnectError")
    assert messages(decide(unprobed, "tokens", top_logprobs=5, shaped_sampling=False)) == [
        "capture not checked before the rollout: the endpoint did not answer the probe: ConnectError"
    ]


def test_black_box_asks_for_text_and_refuses_tokens() -> None:
    assert RolloutRequest(instruction="x", mode="black_box").wanted_capture() == "text"
    with pytest.raises(ValueError, match="black_box mode records no model call"):
        RolloutRequest(instruction="x", mode="black_box", capture="tokens")


def test_a_result_written_before_provenance_still_parses() -> None:
    old = RolloutResult.model_validate_json(
        '{"task_id": "t", "status": "completed", "reward": 1.0, "proxy_turns": [{"turn": 0}], "schema_version": 3}'
    )
    assert old.provenance is None
    assert (old.proxy_turns[0].template_fingerprint, old.proxy_turns[0].template_changed) == (None, False)
