"""Token-in mode: the pure rules, the proxy as a real process against the three kinds of server the scripted model
plays (prime-rl's token route, stock vLLM's forwarded prompt ids on the chat route, neither), and whole rollouts with
the real OpenCode on a thinking template (reasoning dropped from the history)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from opencode_env.proxy.token_in import (
    SessionState,
    forwarding_refused,
    marked_messages,
    new_messages_start,
    routed_body,
    suffix_after_reply,
    suffix_in_full,
)
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import forget_probes
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.chat_template import IM_END, SPECIAL_IDS
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash, demo_script
from opencode_env.testing.proxy_process import running_proxy
from opencode_env.training.sequences import training_sequences, training_summary
from opencode_env.wire import RolloutResult

VLLM = ("--endpoint-kind", "vllm", "--model-override", "scripted-policy")
STOP = SPECIAL_IDS[IM_END]
SYSTEM = {"role": "system", "content": "You are a coder."}
USER = {"role": "user", "content": "list the files"}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def state(messages: list[Any]) -> SessionState:
    return SessionState(messages=messages, rendering="r", ids=[1, 2, 3, STOP], stop_id=STOP)


def test_the_new_messages_start_after_the_last_turn_and_its_reply() -> None:
    reply = {"role": "assistant", "content": "ok"}
    tool = {"role": "tool", "content": "a.txt", "tool_call_id": "c"}
    assert new_messages_start(state([SYSTEM, USER]), [SYSTEM, USER, reply, tool]) == 3


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([SYSTEM, {"role": "user", "content": "summarised"}, {"role": "assistant"}, USER], "rewritten"),
        ([SYSTEM, USER, {"role": "assistant", "content": "ok"}], "rewritten"),
        ([SYSTEM, USER, USER, USER], "not the assistant's reply"),
    ],
)
def test_a_history_that_does_not_continue_the_last_turn_is_named(messages: list[Any], reason: str) -> None:
    answer = new_messages_start(state([SYSTEM, USER]), messages)
    assert isinstance(answer, str)
    assert reason in answer


def test_the_suffix_is_what_follows_the_replys_stop_token() -> None:
    base = [10, 11, STOP, 12]
    assert suffix_after_reply(base, [10, 11, STOP, 12, 20, 21], STOP) == [12, 20, 21]


def test_a_template_that_renders_the_history_otherwise_once_messages_follow_is_refused() -> None:
    answer = suffix_after_reply([10, 11, STOP], [10, 99, STOP, 20], STOP)
    assert isinstance(answer, str)
    assert "renders the history differently" in answer
    assert "part at id 1 of 3" in answer


THINK = 7


def test_a_reply_rendered_otherwise_once_messages_follow_is_found_by_where_the_new_content_starts() -> None:
    """As Qwen3's template with thinking off: the last assistant message carries an empty think block (THINK), the
    same message followed by a tool result does not. The suffix is what follows the reply's stop in the whole render."""
    base = [1, 2, STOP, 3, THINK, 10, 11, STOP]
    full = [1, 2, STOP, 3, 10, 11, STOP, 4, 20, 21, STOP, 3, THINK]
    marked = [1, 2, STOP, 3, 10, 11, STOP, 4, 99, 21, STOP, 3, THINK]
    assert suffix_in_full(full, marked, base, STOP) == [4, 20, 21, STOP, 3, THINK]


def test_a_reply_end_that_closes_another_count_of_messages_is_not_taken() -> None:
    """A template whose render changes before the reply's end (a marked content that parts early, say) must not
    make the proxy send the reply twice: the stop found closes fewer messages than the history holds."""
    base = [1, 2, STOP, 3, 10, 11, STOP]
    full = [1, 2, STOP, 3, 12, 11, STOP, 4, 20, STOP]
    marked = [1, 2, STOP, 3, 99, 11, STOP, 4, 20, STOP]
    answer = suffix_in_full(full, marked, base, STOP)
    assert isinstance(answer, str)
    assert "looks at the whole history" in answer


def test_the_marked_message_changes_its_content_at_the_first_character_only() -> None:
    tool = {"role": "tool", "tool_call_id": "c", "content": "Always"}
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert marked_messages([SYSTEM, tool], 1)[1]["content"] == "BAlways"
    assert marked_messages([SYSTEM, parts], 1)[1]["content"] == [{"type": "text", "text": "Ahi"}]
    assert marked_messages([SYSTEM, {"role": "tool", "content": None}], 1)[1]["content"] == "A"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"echo": True}, "echo"),
        ({"messages": [[USER], [USER]]}, "batch"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "input_audio": {}}]}]}, "'text'"),
    ],
)
def test_a_request_vllm_would_render_itself_is_not_sent_with_forwarded_ids(change: dict[str, Any], named: str) -> None:
    assert forwarding_refused({"messages": [SYSTEM, USER]}) is None
    assert forwarding_refused({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}) is None
    reason = forwarding_refused({"messages": [SYSTEM, USER], **change})
    assert reason is not None
    assert named in reason


async def test_the_agents_own_prompt_ids_never_reach_the_engine(tmp_path: Path) -> None:
    """A request that carries forwarded ids or a KV connector's parameters of its own (a prompt other than its
    messages, a place to fetch a prefill from) is sent without them, token-in or not: the prompt is the proxy's."""
    hostile = {"prompt_token_ids": [1, 2, 3], "do_remote_prefill": True, "remote_host": "10.0.0.9"}
    for token_in in ((), ("--token-in",)):
        scratch = tmp_path / f"token_in_{bool(token_in)}"
        scratch.mkdir()
        with (
            ScriptedModelServer(SCRIPT, forwarded_ids="on", token_routes=True) as model,
            running_proxy(model.base_url, scratch, *VLLM, *token_in) as proxy,
        ):
            await call(proxy.url, {**chat([SYSTEM, USER]), "kv_transfer_params": hostile, "tokens": [5]}, "ses_1")
            proxy.wait_for_turns(1)
        sent = model.exchanges[0].request
        assert ("kv_transfer_params" in sent, "tokens" in sent) == (False, False)
        assert model.exchanges[0].prompt_from == "template"


def test_each_route_carries_the_ids_its_own_way_and_the_request_is_otherwise_unchanged() -> None:
    request = {"model": "m", "messages": [USER], "kv_transfer_params": {"other": 1}}
    assert routed_body(request, "tokens", [1, 2]) == ("/chat/completions/tokens", {**request, "tokens": [1, 2]})
    path, body = routed_body(request, "forwarded", [1, 2])
    assert path == "/chat/completions"
    assert body == {**request, "kv_transfer_params": {"other": 1, "prompt_token_ids": [1, 2]}}
    assert request["kv_transfer_params"] == {"other": 1}


def thinking(text: str, *calls: ToolCallStep) -> Step:
    return Step(reasoning=f"I should {text} first, then look at what it printed.", content="", tool_calls=list(calls))


def chat(messages: list[Any]) -> dict[str, Any]:
    return {
        "model": "policy",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": messages,
        "tools": TOOLS,
    }


RECEIVED: list[bytes] = []
"""Every answer body the calls below received, in order (each test compares its own with the model's bytes)."""


async def call(url: str, payload: dict[str, Any], session: str) -> dict[str, Any]:
    """One streamed call as OpenCode makes it; returns the assistant message OpenCode would put in its history."""
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{url}/chat/completions", json=payload, headers={"authorization": "Bearer x", "x-session-id": session}
        )
    assert response.status_code == 200, response.text
    RECEIVED.append(response.content)
    content, calls = "", dict[int, dict[str, Any]]()
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:])["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                entry = calls.setdefault(
                    part["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["id"] = part.get("id") or entry["id"]
                entry["function"]["name"] += part.get("function", {}).get("name") or ""
                entry["function"]["arguments"] += part.get("function", {}).get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


async def three_turns(url: str, session: str = "ses_1") -> None:
    messages: list[Any] = [SYSTEM, USER]
    for step in range(3):
        reply = await call(url, chat(messages), session)
        messages = [*messages, reply, {"role": "tool", "tool_call_id": f"c{step}", "content": f"out {step}"}]


SCRIPT = Script(
    steps=[
        thinking("list the files", ToolCallStep(name="bash", arguments={"command": "ls"})),
        thinking("read a.txt", ToolCallStep(name="bash", arguments={"command": "cat a.txt"})),
        Step(reasoning="Nothing more to do.", content="Done."),
    ]
)


SERVERS: dict[str, dict[str, Any]] = {
    "token route": {"token_routes": True},
    "forwarded ids": {"forwarded_ids": "on"},
}
SOURCES = {"token route": "token_in", "forwarded ids": "forwarded_ids"}
PROMPT_FROM = {"token route": "tokens", "forwarded ids": "forwarded"}


@pytest.mark.parametrize("server", list(SERVERS))
@pytest.mark.parametrize("route", ["auto", "proved"])
async def test_each_turn_extends_the_last_by_construction_on_a_thinking_template(
    tmp_path: Path, server: str, route: str
) -> None:
    """`auto` tries the routes in turn (no probe); `proved` is the route the probe found, given to the proxy."""
    named = {"token route": "tokens", "forwarded ids": "forwarded"}[server] if route == "proved" else "auto"
    RECEIVED.clear()
    with (
        ScriptedModelServer(SCRIPT, **SERVERS[server]) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--token-in", named) as proxy,
    ):
        await three_turns(proxy.url)
        trace = proxy.wait_for_turns(3)
    turns = trace.turns
    assert [turn.prompt_source for turn in turns] == ["chat_template", SOURCES[server], SOURCES[server]]
    assert [exchange.prompt_from for exchange in model.exchanges] == ["template", *[PROMPT_FROM[server]] * 2]
    assert [bytes(exchange.sent) for exchange in model.exchanges] == RECEIVED
    assert turns[0].token_in_fallback == "the session's first turn"
    for earlier, later in itertools.pairwise(turns):
        sampled = earlier.prompt_token_ids + earlier.completion_token_ids
        assert later.prompt_token_ids[: len(sampled)] == sampled
    exchanges = model.exchanges
    assert [exchange.prompt_token_ids for exchange in exchanges] == [turn.prompt_token_ids for turn in turns]
    reasoning_ids = [token.token_id for token in exchanges[0].tokens if token.segment.kind == "reasoning"]
    assert reasoning_ids
    assert turns[1].prompt_token_ids[len(turns[0].prompt_token_ids) :][: len(reasoning_ids)] == reasoning_ids
    assert "tokens" not in turns[1].request
    assert "kv_transfer_params" not in turns[1].request
    assert all("add_generation_prompt" in request for request in model.model.tokenize_requests)


async def test_without_token_in_the_thinking_template_forks_every_turn(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(SCRIPT, token_routes=True) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        await three_turns(proxy.url)
        turns = proxy.wait_for_turns(3).turns
    assert [turn.prompt_source for turn in turns] == ["chat_template"] * 3
    sampled = turns[0].prompt_token_ids + turns[0].completion_token_ids
    assert turns[1].prompt_token_ids[: len(sampled)] != sampled
    assert model.model.tokenize_requests == []


async def test_a_template_that_renders_the_last_reply_otherwise_still_extends_by_construction(tmp_path: Path) -> None:
    """Qwen3's kind of template (an empty think block on the last assistant message only): without token-in every
    turn forks; with it, every turn extends the last, its suffix found in the whole render."""
    for token_in in ((), ("--token-in",)):
        scratch = tmp_path / f"token_in_{bool(token_in)}"
        scratch.mkdir()
        with (
            ScriptedModelServer(SCRIPT, forwarded_ids="on", template="think_last") as model,
            running_proxy(model.base_url, scratch, *VLLM, *token_in) as proxy,
        ):
            await three_turns(proxy.url)
            turns = proxy.wait_for_turns(3).turns
        extends = [
            later.prompt_token_ids[: len(earlier.prompt_token_ids) + len(earlier.completion_token_ids)]
            == earlier.prompt_token_ids + earlier.completion_token_ids
            for earlier, later in itertools.pairwise(turns)
        ]
        if token_in:
            assert [turn.prompt_source for turn in turns] == ["chat_template", "forwarded_ids", "forwarded_ids"]
            assert extends == [True, True]
        else:
            assert extends == [False, False]


async def test_a_server_with_neither_route_is_asked_each_once_then_the_chat_template_with_the_reasons(
    tmp_path: Path,
) -> None:
    """auto on a server without the token route that ignores forwarded ids (the template renders every prompt):
    turn 2 finds the token route missing (404) and sends forwarded ids, which the engine's echo shows were ignored;
    turn 3 takes the chat route at once, naming both. OpenCode gets the server's bytes whatever happened."""
    RECEIVED.clear()
    with (
        ScriptedModelServer(SCRIPT) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--token-in") as proxy,
    ):
        await three_turns(proxy.url)
        turns = proxy.wait_for_turns(3).turns
    assert [turn.outcome for turn in turns] == ["complete"] * 3
    assert [turn.prompt_source for turn in turns] == ["chat_template"] * 3
    second, third = turns[1].token_in_fallback or "", turns[2].token_in_fallback or ""
    assert "did not echo the prompt ids sent by the forwarded route" in second
    assert "tokens route (HTTP 404" in third
    assert "did not echo" in third
    sent = [exchange.request for exchange in model.exchanges]
    assert [("kv_transfer_params" in request) for request in sent] == [False, True, False]
    assert [bytes(exchange.sent) for exchange in model.exchanges] == RECEIVED
    assert [turn.prompt_token_ids for turn in turns] == [exchange.prompt_token_ids for exchange in model.exchanges]


async def test_a_server_that_refuses_the_forwarded_ids_is_answered_by_the_chat_route(tmp_path: Path) -> None:
    """A server that answers 400 to the field (one that forbids unknown fields): the same turn goes again without
    the ids, the route is dropped since the plain request then succeeded, and OpenCode sees only the good answers."""
    RECEIVED.clear()
    with (
        ScriptedModelServer(SCRIPT, forwarded_ids="refused") as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--token-in", "forwarded") as proxy,
    ):
        await three_turns(proxy.url)
        turns = proxy.wait_for_turns(3).turns
    assert [turn.outcome for turn in turns] == ["complete"] * 3
    assert [turn.prompt_source for turn in turns] == ["chat_template"] * 3
    assert "forwarded route (HTTP 400" in (turns[1].token_in_fallback or "")
    assert turns[2].token_in_fallback == turns[1].token_in_fallback
    assert [exchange.status for exchange in model.exchanges] == [200, 400, 200, 200]
    assert [bytes(exchange.sent) for exchange in model.exchanges if exchange.status == 200] == RECEIVED


async def test_a_server_without_the_token_route_falls_back_and_says_so(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(SCRIPT, tokenize=False) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--token-in") as proxy,
    ):
        await three_turns(proxy.url)
        turns = proxy.wait_for_turns(3).turns
    assert [turn.outcome for turn in turns] == ["complete"] * 3
    assert [turn.prompt_source for turn in turns] == ["chat_template"] * 3
    assert "/tokenize (404)" in (turns[1].token_in_fallback or "")
    assert turns[2].token_in_fallback == turns[1].token_in_fallback


async def test_a_rewritten_history_falls_back_for_that_turn_only(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(SCRIPT, token_routes=True) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--token-in") as proxy,
    ):
        first = await call(proxy.url, chat([SYSTEM, USER]), "ses_1")
        compacted = [SYSTEM, {"role": "user", "content": "Summary: listed the files."}]
        second = await call(proxy.url, chat(compacted), "ses_1")
        await call(
            proxy.url, chat([*compacted, second, {"role": "tool", "tool_call_id": "c", "content": "x"}]), "ses_1"
        )
        turns = proxy.wait_for_turns(3).turns
    assert first["tool_calls"]
    assert [turn.prompt_source for turn in turns] == ["chat_template", "chat_template", "token_in"]
    assert "rewritten" in (turns[1].token_in_fallback or "")


ROLLOUT_SCRIPT = Script(
    steps=[
        thinking(
            "write the file",
            ToolCallStep(name="write", arguments={"filePath": "/home/user/workdir/a.txt", "content": "hi\n"}),
        ),
        Step(reasoning="Check it.", tool_calls=bash("cat /home/user/workdir/a.txt").tool_calls),
        Step(reasoning="It is there.", content="I wrote a.txt."),
    ]
)


async def token_in_rollout(backend: LocalBackend, token_in: str | None, **server: Any) -> RolloutResult:
    """A rollout of ROLLOUT_SCRIPT; token_in None: the request's default."""
    forget_probes()
    with ScriptedModelServer(ROLLOUT_SCRIPT, **server) as model:
        chosen = {} if token_in is None else {"token_in": token_in}
        request = demo_request(
            model.base_url, verify=["test -f /home/user/workdir/a.txt"], agent_timeout_s=600, **chosen
        )
        result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert [turn.kind for turn in result.proxy_turns].count("agent") == 3
    assert [exchange.prompt_token_ids for exchange in model.exchanges if exchange.request.get("tools")] == [
        turn.prompt_token_ids for turn in result.proxy_turns if turn.kind == "agent"
    ]
    return result


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_whole_rollout_in_token_in_mode_is_one_sequence_with_every_agent_token(
    backend: LocalBackend, no_leaks: None, server: str
) -> None:
    """The real OpenCode, a thinking template that drops earlier reasoning, a request that says nothing of token-in
    (auto is the default): the probe proves the server's route, the proxy takes it on every continued turn, and the
    TRL row carries every agent token."""
    result = await token_in_rollout(backend, None, **SERVERS[server])
    assert result.task is not None
    assert result.task.token_in == "auto"
    agent = [turn for turn in result.proxy_turns if turn.kind == "agent"]
    assert [turn.prompt_source for turn in agent] == ["chat_template", SOURCES[server], SOURCES[server]]
    assert result.provenance is not None
    assert result.provenance.endpoint is not None
    support = result.provenance.endpoint.capabilities.token_in
    assert support is not None
    assert support.route == PROMPT_FROM[server]
    found = training_sequences(result)
    assert (len(found.sequences), found.forks) == (1, [])
    row = training_summary(result, found).coverage.trl_row
    assert row.covered_tokens == row.agent_tokens == sum(len(turn.completion_token_ids) for turn in agent)
    assert not [warning for warning in result.warnings if "TRL row" in warning or "token-in" in warning]


async def test_a_server_with_neither_route_forks_at_every_turn_and_the_result_says_so_with_the_fix(
    backend: LocalBackend, no_leaks: None
) -> None:
    """token_in='auto' on a server that takes no prompt ids: the probe proves none, the proxy sends every turn by
    the chat template with the probe's reason, the thinking template forks the session at each turn (recorded), and
    the result warns that the TRL row holds under 90% of the agent tokens, with the fix."""
    result = await token_in_rollout(backend, "auto")
    agent = [turn for turn in result.proxy_turns if turn.kind == "agent"]
    assert [turn.prompt_source for turn in agent] == ["chat_template"] * 3
    assert result.provenance is not None
    assert result.provenance.endpoint is not None
    support = result.provenance.endpoint.capabilities.token_in
    assert support is not None
    assert support.route == "none"
    assert [turn.token_in_fallback for turn in agent[1:]] == [support.problem] * 2
    found = training_sequences(result)
    assert len(found.sequences) == 3
    assert [fork.cause for fork in found.forks] == ["template_drift"] * 2
    row = training_summary(result, found).coverage.trl_row
    assert row.covered_tokens < row.agent_tokens * 0.9
    assert not [warning for warning in result.warnings if warning.startswith("token-in")]  # the TRL row's says it
    short = [warning for warning in result.warnings if warning.startswith("the TRL row holds")]
    assert len(short) == 1
    assert f"{row.covered_tokens:,} of {row.agent_tokens:,} agent tokens" in short[0]
    assert "2 fork(s)" in short[0]
    assert "token_in='auto'" in short[0]


async def test_a_default_rollout_on_the_scripted_model_is_one_sequence_with_every_agent_token(
    backend: LocalBackend, no_leaks: None
) -> None:
    """A newcomer's first rollout: the scripted model as it starts by default (neither token-in route; a template that
    re-renders its history as it was sampled), a request that says nothing of token-in: the TRL row holds >= 99% of
    the agent tokens and no warning says otherwise."""
    forget_probes()
    with ScriptedModelServer(demo_script()) as model:
        result = await run_rollout(demo_request(model.base_url, agent_timeout_s=600), backend)
    assert result.status == "completed", result.error
    row = training_summary(result).coverage.trl_row
    assert row.agent_tokens > 0
    assert row.covered_tokens >= 0.99 * row.agent_tokens
    assert not [warning for warning in result.warnings if warning.startswith("the TRL row holds")]
