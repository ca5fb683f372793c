"""Fail-closed capture and provenance: the endpoint probe before any sandbox, the template checked on every call.

The real rollouts run the demo task without its check step (`WRITE_AND_SAY`: two agent calls with a tool's output
between them, and the demo's verify still passes): what these tests check is the capture and the provenance of each
call, and two calls are what a template change between calls, or a fingerprint that stays put across calls, needs.
The four rollouts are not shared, as each test's request or model differs in what the other tests assert: the
fingerprint test's two rollouts need a model whose template never changes (and the second one the first one's cached
probe), the template-change test a model whose template switches, the text-mode test a model without token ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import forget_probes, probe_endpoint
from opencode_env.rollout.preflight.probe_diagnosis import EndpointUnreachable
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, demo_script, say, write
from opencode_env.testing.proxy_process import running_proxy
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest, RolloutResult

CALL = {
    "model": "policy",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "list the files"}],
    "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
}


WRITE_AND_SAY = Script(
    steps=[write("/home/user/workdir/add.py", "def add(a, b):\n    return a + b\n"), say("I wrote add.py.")]
)


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()


def readme_request(base_url: str, **fields: object) -> RolloutRequest:
    """The README's 'base_url + model directly': no endpoint name."""
    return demo_request(base_url, endpoint="", **fields)


def upstream(base_url: str) -> Upstream:
    return Upstream("", base_url, "sk-probe-key", "scripted-policy", disable_thinking=False)


async def test_an_endpoint_without_token_ids_is_refused_before_any_sandbox_with_the_fix() -> None:
    backend = StubBackend()
    with ScriptedModelServer(demo_script(), omit_token_ids=True) as model:
        result = await run_rollout(readme_request(model.base_url), backend)
        assert model.exchanges == []
    assert (result.status, result.failed_phase) == ("invalid_request", "validate")
    assert result.sandbox_id == ""
    assert "completion token ids" in (result.error or "")
    assert "--return-tokens-as-token-ids" in (result.error or "")
    assert "capture='text'" in (result.error or "")
    assert result.provenance is not None
    assert result.provenance.endpoint is not None
    assert result.provenance.endpoint.capabilities.logprobs
    assert not result.provenance.endpoint.capabilities.completion_token_ids


async def test_an_endpoint_without_logprobs_is_refused_in_logprobs_mode() -> None:
    with ScriptedModelServer(demo_script(), omit_token_ids=True, omit_logprobs=True) as model:
        result = await run_rollout(readme_request(model.base_url, capture="logprobs"), StubBackend())
    assert result.status == "invalid_request"
    assert "per-token logprobs" in (result.error or "")
    assert "--max-logprobs" in (result.error or "")


async def test_an_endpoint_refusing_tools_is_refused_in_every_mode_with_the_flags() -> None:
    """vLLM's default: a request that offers tools is a 400; OpenCode offers them on every call (seen on 0.32)."""
    for capture in ("tokens", "text"):
        forget_probes()
        backend = StubBackend()
        with ScriptedModelServer(demo_script(), refuse_tools=True) as model:
            result = await run_rollout(readme_request(model.base_url, capture=capture), backend)
            assert model.exchanges == []
        assert (result.status, result.failed_phase, result.sandbox_id) == ("invalid_request", "validate", "")
        assert "--enable-auto-tool-choice" in (result.error or "")
        assert "--tool-call-parser" in (result.error or "")
        assert result.provenance is not None
        assert result.provenance.endpoint is not None
        assert result.provenance.endpoint.capabilities.tool_calls == "no"
        assert "HTTP 400" in (result.provenance.endpoint.capabilities.tools_refused or "")


async def test_the_key_goes_to_the_endpoint_and_nowhere_in_the_result() -> None:
    with ScriptedModelServer(demo_script(), omit_token_ids=True) as model:
        result = await run_rollout(readme_request(model.base_url, api_key="sk-probe-secret"), StubBackend())
        sent = {exchange.headers.get("authorization") for exchange in model.model.probe_exchanges}
    assert sent == {"Bearer sk-probe-secret"}
    assert "sk-probe-secret" not in result.model_dump_json()


async def test_the_probe_tells_raw_from_processed_logprobs_and_sees_tool_calls() -> None:
    with ScriptedModelServer(demo_script(), logprobs_mode="raw") as raw_model:
        raw = await probe_endpoint(upstream(raw_model.base_url), top_logprobs=5)
    with ScriptedModelServer(demo_script(), logprobs_mode="processed") as processed_model:
        processed = await probe_endpoint(upstream(processed_model.base_url), top_logprobs=5)
    assert (raw.capabilities.logprobs_kind, processed.capabilities.logprobs_kind) == ("raw", "processed")
    assert raw.capabilities.tool_calls == "yes"
    assert raw.capabilities.completion_token_ids
    assert raw.capabilities.prompt_token_ids
    assert raw.model is not None
    assert raw.model.id == "scripted-policy"
    assert raw.template_fingerprint is not None
    assert raw.template_fingerprint.startswith("sha256:")
    assert raw_model.exchanges == []


async def test_the_probe_is_cached_per_endpoint_and_an_unreachable_one_is_not() -> None:
    with ScriptedModelServer(demo_script()) as model:
        first = await probe_endpoint(upstream(model.base_url), top_logprobs=5)
        calls = len(model.model.probe_exchanges)
        again = await probe_endpoint(upstream(model.base_url), top_logprobs=5)
        assert len(model.model.probe_exchanges) == calls
    assert (first.cached, again.cached) == (False, True)
    assert again.template_fingerprint == first.template_fingerprint
    for _ in range(2):  # refused each time, never from the cache
        with pytest.raises(EndpointUnreachable, match="refused the connection"):
            await probe_endpoint(upstream("http://127.0.0.1:9/v1"), top_logprobs=5)


async def test_the_readme_path_captures_token_ids_and_the_fingerprint_is_stable_across_rollouts(
    backend: LocalBackend, no_leaks: None
) -> None:
    with ScriptedModelServer(WRITE_AND_SAY) as model:
        first = await run_rollout(readme_request(model.base_url, policy_version="step-40"), backend)
        second = await run_rollout(readme_request(model.base_url), backend)
    for result in (first, second):
        assert result.status == "completed", result.error
        agent = [turn for turn in result.proxy_turns if turn.kind == "agent"]
        assert agent
        assert all(turn.completion_token_ids and turn.prompt_token_ids for turn in agent)
        assert not any(turn.template_changed for turn in result.proxy_turns)
        assert not any("template" in warning for warning in result.warnings)
    assert first.provenance is not None
    assert second.provenance is not None
    assert first.provenance.policy_version == "step-40"
    assert first.provenance.template_fingerprint is not None
    assert first.provenance.template_fingerprint == second.provenance.template_fingerprint
    assert all(turn.template_fingerprint == first.provenance.template_fingerprint for turn in first.proxy_turns)
    assert second.provenance.endpoint is not None
    assert second.provenance.endpoint.cached
    assert first.provenance.config_sha256 is not None
    assert first.provenance.config_sha256 == second.provenance.config_sha256
    assert set(first.provenance.config_parts) == {"config", "system_prompts", "tools"}


async def test_a_template_change_between_two_calls_is_flagged_on_the_turn_and_in_the_warnings(
    backend: LocalBackend, no_leaks: None
) -> None:
    with ScriptedModelServer(WRITE_AND_SAY, template_switch_after=1) as model:
        result = await run_rollout(readme_request(model.base_url), backend)
    assert result.status == "completed", result.error
    changed = [turn.turn for turn in result.proxy_turns if turn.template_changed]
    assert changed
    assert len(changed) < len(result.proxy_turns)
    assert result.provenance is not None
    assert result.provenance.template_changed_turns == changed
    [warning] = [warning for warning in result.warnings if "chat template changed during" in warning]
    assert ", ".join(map(str, changed)) in warning
    again = RolloutResult.model_validate_json(result.model_dump_json())
    assert [turn.template_changed for turn in again.proxy_turns] == [t.template_changed for t in result.proxy_turns]


async def test_text_mode_accepts_an_endpoint_without_token_ids_and_says_so(
    backend: LocalBackend, no_leaks: None
) -> None:
    with ScriptedModelServer(WRITE_AND_SAY, omit_token_ids=True) as model:
        result = await run_rollout(readme_request(model.base_url, capture="text"), backend)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert any("returns no token ids" in warning for warning in result.warnings)
    assert all(not turn.completion_token_ids for turn in result.proxy_turns)


async def test_the_proxy_fingerprints_every_call_and_records_the_engines_policy_version(tmp_path: Path) -> None:
    """The proxy alone, as a real process: the template switches after the first call's check."""
    args = ("--endpoint-kind", "", "--model-override", "scripted-policy", "--return-token-ids", "on")
    with (
        ScriptedModelServer(demo_script(), template_switch_after=1, policy_version="ckpt-7") as model,
        running_proxy(
            model.base_url, tmp_path, *args, "--template-check", "--policy-version-header", "X-Policy-Version"
        ) as proxy,
    ):
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(2):
                answer = await client.post(f"{proxy.url}/chat/completions", json=CALL, headers={"x-session-id": "s"})
                assert answer.status_code == 200, answer.text
        turns = proxy.wait_for_turns(2).turns
        checks = model.model.template_checks
    first, second = (turn.template_fingerprint for turn in turns)
    assert first is not None
    assert second is not None
    assert first != second
    assert checks == 2
    assert [turn.policy_version for turn in turns] == ["ckpt-7", "ckpt-7"]
    assert all(turn.completion_token_ids for turn in turns)
