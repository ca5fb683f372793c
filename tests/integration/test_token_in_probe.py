"""The endpoint probe's two-turn token-in check, against each kind of server the scripted model plays, and the
decision it leads to: the route the proxy is given, or (token_in="require") a refusal that names why and the fix.
The refusal is checked before any sandbox: a stub backend that would fail if it were asked for one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import TOOL_MESSAGES, decide, forget_probes, probe_endpoint
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire.provenance import EndpointProbe


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()


def upstream(base_url: str) -> Upstream:
    return Upstream("vllm", base_url, "sk-probe-key", "scripted-policy", disable_thinking=False)


async def probed(**server: Any) -> tuple[EndpointProbe, list[dict[str, Any]]]:
    with ScriptedModelServer(demo_script(), **server) as model:
        probe = await probe_endpoint(upstream(model.base_url), top_logprobs=5, token_in=True)
        sent = [exchange.request for exchange in model.model.probe_exchanges]
    assert model.exchanges == []
    return probe, sent


async def test_a_server_with_the_token_route_is_proven_by_it_and_the_chat_route_not_tried() -> None:
    probe, sent = await probed(token_routes=True)
    support = probe.capabilities.token_in
    assert support is not None
    assert (support.route, support.suffix, support.forwarded_ids) == ("tokens", "rendered", "")
    assert "ids echoed exactly" in support.tokens_route
    assert "tool call parsed" in support.tokens_route
    assert sum("tokens" in request for request in sent) == 1
    assert not any("kv_transfer_params" in request for request in sent)


async def test_stock_vllm_is_proven_by_the_forwarded_ids_after_the_token_route_is_found_missing() -> None:
    probe, sent = await probed(forwarded_ids="on")
    support = probe.capabilities.token_in
    assert support is not None
    assert support.route == "forwarded"
    assert support.tokens_route == "absent (HTTP 404)"
    assert "ids echoed exactly" in support.forwarded_ids
    assert "tool call parsed" in support.forwarded_ids
    forwarded = [request for request in sent if "kv_transfer_params" in request]
    assert len(forwarded) == 1
    turn_two = forwarded[0]["kv_transfer_params"]["prompt_token_ids"]
    assert forwarded[0]["messages"] == TOOL_MESSAGES
    assert len(turn_two) > 0


async def test_a_server_that_ignores_the_ids_proves_no_route_and_says_what_each_did() -> None:
    probe, _ = await probed()
    support = probe.capabilities.token_in
    assert support is not None
    assert support.route == "none"
    assert support.tokens_route == "absent (HTTP 404)"
    assert support.forwarded_ids.startswith("ignored: the server rendered the messages instead")
    assert support.problem is not None
    assert "ignored" in support.problem


async def test_ids_taken_but_tool_calls_left_unparsed_do_not_prove_the_route() -> None:
    probe, _ = await probed(forwarded_ids="unparsed")
    support = probe.capabilities.token_in
    assert support is not None
    assert probe.capabilities.tool_calls == "yes"
    assert support.route == "none"
    assert support.forwarded_ids == "ids echoed exactly, but no tool call parsed where the chat route parsed one"


async def test_a_server_that_refuses_the_field_proves_no_route() -> None:
    probe, _ = await probed(forwarded_ids="refused")
    support = probe.capabilities.token_in
    assert support is not None
    assert support.route == "none"
    assert support.forwarded_ids.startswith("refused (HTTP 400")


async def test_without_tokenize_no_route_can_render_a_suffix() -> None:
    probe, _ = await probed(forwarded_ids="on", tokenize=False)
    support = probe.capabilities.token_in
    assert support is not None
    assert support.route == "none"
    assert "/tokenize with messages answered HTTP 404" in (support.problem or "")


async def test_the_token_in_check_runs_only_when_asked_and_is_cached_apart() -> None:
    with ScriptedModelServer(demo_script(), forwarded_ids="on") as model:
        plain = await probe_endpoint(upstream(model.base_url), top_logprobs=5)
        calls = len(model.model.probe_exchanges)
        checked = await probe_endpoint(upstream(model.base_url), top_logprobs=5, token_in=True)
    assert plain.capabilities.token_in is None
    assert not checked.cached
    assert checked.capabilities.token_in is not None
    assert len(model.model.probe_exchanges) > calls


@pytest.mark.parametrize("server", [{}, {"forwarded_ids": "unparsed"}])
async def test_require_refuses_a_server_without_a_route_naming_why_and_the_fix(server: dict[str, Any]) -> None:
    probe, _ = await probed(**server)
    decision = decide(probe, "tokens", top_logprobs=5, shaped_sampling=False, token_in="require")
    assert decision.refusal is not None
    assert decision.refusal.startswith("token_in='require': the server takes no prompt ids (token route: absent")
    assert "kv_transfer_params.prompt_token_ids" in decision.refusal
    assert "token_in='auto'" in decision.refusal
    auto = decide(probe, "tokens", top_logprobs=5, shaped_sampling=False, token_in="auto")
    assert auto.refusal is None
    assert not [notice for notice in auto.warnings if notice.message.startswith("token-in")]  # trl_row_short's job


async def test_require_refuses_before_any_sandbox() -> None:
    backend = StubBackend()
    with ScriptedModelServer(demo_script()) as model:
        refused = await run_rollout(demo_request(model.base_url, token_in="require"), backend)
    assert (refused.status, refused.failed_phase, refused.sandbox_id) == ("invalid_request", "validate", "")
    assert "token_in='require'" in (refused.error or "")
    assert refused.provenance is not None
    assert refused.provenance.endpoint is not None
    assert refused.provenance.endpoint.capabilities.token_in is not None
    assert backend.alive == set()


async def test_require_accepts_a_proven_server() -> None:
    with ScriptedModelServer(demo_script(), forwarded_ids="on") as model:
        probe = await probe_endpoint(upstream(model.base_url), top_logprobs=5, token_in=True)
    decision = decide(probe, "tokens", top_logprobs=5, shaped_sampling=False, token_in="require")
    assert decision.refusal is None
    assert not [notice for notice in decision.warnings if "token-in" in notice.message]


async def test_a_template_that_looks_at_the_whole_history_still_gives_the_probe_its_suffix() -> None:
    probe, _ = await probed(forwarded_ids="on", template="think_last")
    support = probe.capabilities.token_in
    assert support is not None
    assert (support.route, support.suffix) == ("forwarded", "rendered")
