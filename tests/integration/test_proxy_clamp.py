"""One completion per call: the real proxy, between a real HTTP client and the scripted model, holds every request to
one completion and records what the agent asked for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opencode_env.proxy.request import clamped_fields
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, say
from opencode_env.testing.proxy_process import ProxyProcess, running_proxy
from tests.integration.test_proxy_http import VLLM, body, post

REWRITTEN_FOR_VLLM = {
    "model": "scripted-policy",
    "max_tokens": 4096,
    "logprobs": True,
    "top_logprobs": 5,
    "return_token_ids": True,
}


def turn_lines(proxy: ProxyProcess, count: int) -> list[dict[str, Any]]:
    """The raw turn records of the trace, as the proxy wrote them."""
    proxy.wait_for_turns(count)
    records = [json.loads(line) for line in proxy.trace_path.read_bytes().splitlines()]
    return [record for record in records if record["type"] == "turn"]


async def test_an_agent_asking_for_64_completions_gets_one_and_the_record_says_what_it_asked(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[say("only one")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, _raw = await post(proxy.url, body(n=64, best_of=8))
        turn = proxy.wait_for_turns(1).turns[0]
    sent = model.exchanges[0].request
    assert response.status_code == 200
    assert sent["n"] == 1
    assert "best_of" not in sent
    assert turn.clamped == {"n": 64, "best_of": 8}
    assert (turn.outcome, turn.response["content"]) == ("complete", "only one")
    assert turn.request["n"] == 1


async def test_beam_search_in_a_non_streamed_request_is_removed_and_recorded(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[say("plain")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, _raw = await post(proxy.url, body(stream=False, n=4, use_beam_search=True))
        turn = proxy.wait_for_turns(1).turns[0]
    sent = model.exchanges[0].request
    assert response.status_code == 200
    assert (sent["n"], "use_beam_search" in sent) == (1, False)
    assert turn.clamped == {"n": 4, "use_beam_search": True}
    assert (turn.stream, turn.outcome) == (False, "complete")


async def test_opencodes_normal_request_is_forwarded_as_before_and_records_nothing_clamped(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[say("normal")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, _raw = await post(proxy.url, body(), **{"x-session-id": "ses_1"})
        records = turn_lines(proxy, 1)
        turn = proxy.trace().turns[0]
    assert response.status_code == 200
    assert model.exchanges[0].request == {**body(), **REWRITTEN_FOR_VLLM}
    assert records[0]["clamped"] == {}
    assert turn.clamped == {}


async def test_knobs_already_at_one_completion_are_forwarded_as_sent(tmp_path: Path) -> None:
    neutral = {"n": 1, "best_of": 1, "use_beam_search": False}
    with (
        ScriptedModelServer(Script(steps=[say("a"), say("b")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        await post(proxy.url, body(**neutral))
        await post(proxy.url, body(n=None, best_of=None))
        records = turn_lines(proxy, 2)
    assert model.exchanges[0].request == {**body(**neutral), **REWRITTEN_FOR_VLLM}
    assert model.exchanges[1].request == {**body(n=None, best_of=None), **REWRITTEN_FOR_VLLM}
    assert [record["clamped"] for record in records] == [{}, {}]


def test_only_the_neutral_value_itself_passes() -> None:
    """`True == 1` and `1.0 == 1` in Python, but neither is the integer 1 an upstream may read differently."""
    assert clamped_fields({"n": True, "best_of": 1.0, "use_beam_search": 0}) == {
        "n": True,
        "best_of": 1.0,
        "use_beam_search": 0,
    }
    assert clamped_fields({"n": "64", "temperature": 0.7, "messages": []}) == {"n": "64"}
