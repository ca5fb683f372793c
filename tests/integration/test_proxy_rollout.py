"""transparent_proxy end to end: the real OpenCode, the proxy in the sandbox, the scripted model on loopback.

A real OpenCode run is the suite's biggest cost, so the three tests that only read a completed capture share one
rollout (`deep_capture`): the demo task with a final message holding Unicode line separators, top_logprobs=5, in a
sandbox whose tree lives deep. None of these changes what another test reads: where the tree lives is not in what
the capture or the final text hold, and the only way it could matter (a proxy socket path too long) fails the
rollout, hence all three tests; the final message is the demo's last turn, which the capture test compares token by
token with what the model sent, as it does the other two; top_logprobs only adds alternatives, which only the
capture test reads.

The rest cannot share: the 500 and the 400 each change which calls OpenCode makes and how it ends (the capture test
needs three complete calls), black_box mode captures nothing, and the proxy that cannot start needs a backend of its
own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from opencode_env.sandbox.base import ProvidedTools
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.script import Script, bash, demo_script, fail, say
from tests.helpers import Outcome, rollout

UNICODE_TEXT = "Done: a\u2028b\u2029c\u0085d."


@dataclass
class DeepCapture:
    outcome: Outcome
    tree: Path


@pytest.fixture(scope="module")
async def deep_capture(tmp_path_factory: pytest.TempPathFactory, leak_check: Callable[[], None]) -> DeepCapture:
    """A unix socket's path is limited to 107 bytes; CI checkouts and pytest's directories are deep."""
    tree = tmp_path_factory.mktemp("deep") / ("d" * 60) / ("e" * 60)
    tree.mkdir(parents=True)
    demo_steps = demo_script().steps
    script = Script(steps=[*demo_steps[:-1], say(UNICODE_TEXT)])
    outcome = await rollout(LocalBackend(cached_tools, base_dir=tree), script, mode="transparent_proxy", top_logprobs=5)
    leak_check()
    return DeepCapture(outcome, tree)


async def test_every_token_is_captured_exactly(deep_capture: DeepCapture) -> None:
    outcome = deep_capture.outcome
    result, exchanges = outcome.result, outcome.exchanges
    assert result.status == "completed", result.error
    assert len(result.proxy_turns) == len(exchanges) == 3
    for index, (turn, exchange) in enumerate(zip(result.proxy_turns, exchanges, strict=True)):
        assert turn.completion_tokens == [t.text for t in exchange.tokens]
        assert turn.completion_token_ids == [t.token_id for t in exchange.tokens]
        assert turn.per_token_logps == [t.logprob for t in exchange.tokens]
        assert turn.top_logprobs == [
            [(text, logprob, None) for text, _, logprob in [(t.text, t.token_id, t.logprob), *t.alternatives][:5]]
            for t in exchange.tokens
        ]
        assert turn.prompt_token_ids == exchange.prompt_token_ids
        assert (turn.aligned, turn.token_id_source, turn.outcome, turn.kind) == (
            True,
            "return_token_ids",
            "complete",
            "agent",
        )
        assert result.turn_messages(index) == exchange.request["messages"]
        assert result.request_tools[turn.tools_sha256 or ""] == exchange.request["tools"]
        assert turn.request["max_tokens"] == exchange.request["max_tokens"] == 4096
        assert turn.headers["x-session-id"] == exchange.headers["x-session-id"]
        assert exchange.headers["authorization"] == "Bearer sk-demo-not-a-secret"
    first, second = result.proxy_turns[0], result.proxy_turns[1]
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.completion_token_ids)] == (
        first.prompt_token_ids + first.completion_token_ids
    )
    assert result.usage.source == "proxy"
    assert result.usage.completion_tokens == sum(len(e.tokens) for e in exchanges)
    assert "sk-demo-not-a-secret" not in result.model_dump_json()


async def test_unicode_line_separators_reach_opencode_intact(deep_capture: DeepCapture) -> None:
    result = deep_capture.outcome.result
    assert result.status == "completed", result.error
    assert result.agent_final_text == UNICODE_TEXT
    assert result.proxy_turns[-1].response["content"] == UNICODE_TEXT
    assert "".join(result.proxy_turns[-1].completion_tokens[:-1]) == UNICODE_TEXT


async def test_a_500_then_success_is_retried_by_opencode(backend: LocalBackend, no_leaks: None) -> None:
    script = Script(steps=[fail(500, retry_after_s=0.2), bash("echo hi > /home/user/workdir/hi.txt"), say("ok")])
    outcome = await rollout(backend, script, mode="transparent_proxy", verify=["test -f /home/user/workdir/hi.txt"])
    result = outcome.result
    assert result.status == "completed", result.error
    assert [(t.upstream_status, t.outcome) for t in result.proxy_turns] == [
        (500, "upstream_error"),
        (200, "complete"),
        (200, "complete"),
    ]
    assert result.reward == 1.0


async def test_a_400_stops_the_agent_at_its_first_call_with_an_upstream_error(
    backend: LocalBackend, no_leaks: None
) -> None:
    outcome = await rollout(backend, Script(steps=[fail(400, message="context too long")]), mode="transparent_proxy")
    result = outcome.result
    assert (result.status, result.failed_phase) == ("upstream_error", "agent")
    assert "context too long" in (result.error or "")
    assert len(outcome.exchanges) == 1
    assert [r.exit_code for r in result.verify_results] == [1, 1]


async def test_black_box_mode_captures_no_turns(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(backend, demo_script(), mode="black_box")
    assert outcome.result.status == "completed"
    assert outcome.result.proxy_turns == []
    assert outcome.result.usage.source == "opencode_events"


async def test_a_proxy_that_cannot_start_fails_the_rollout_clearly(sandbox_base: Path, no_leaks: None) -> None:
    async def broken_python() -> ProvidedTools:
        tools = await cached_tools()
        return ProvidedTools(
            opencode=tools.opencode, opencode_version=tools.opencode_version, python="/bin/false", proxy_ready=True
        )

    outcome = await rollout(LocalBackend(broken_python, base_dir=sandbox_base), demo_script(), mode="transparent_proxy")
    result = outcome.result
    assert (result.status, result.failed_phase) == ("proxy_error", "proxy")
    assert "exited at start" in (result.error or "")
    assert outcome.exchanges == []


async def test_a_rollout_whose_tree_lives_deep_still_reaches_its_proxy(deep_capture: DeepCapture) -> None:
    outcome = deep_capture.outcome
    assert len(str(deep_capture.tree)) > 107
    assert outcome.result.status == "completed", outcome.result.error
    assert len(outcome.result.proxy_turns) == 3
    assert list(deep_capture.tree.iterdir()) == []
