"""The scripted model streams several tokens per chunk when a step asks (vLLM's --stream-interval): each chunk one
segment's tokens, with their ids and logprobs in order, so a reply of 50k tokens streams quickly and is captured
exactly by the real proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep
from opencode_env.testing.proxy_process import running_proxy
from tests.integration.test_proxy_http import VLLM, body, post

TEXT = "word " * 40 + "end."
CALL = ToolCallStep(name="bash", arguments={"command": "echo " + "x " * 30, "description": "Echo"})


def chunked_step(per_chunk: int = 8) -> Step:
    return Step(content=TEXT, tool_calls=[CALL], tokens_per_chunk=per_chunk)


def token_chunks(raw: bytes) -> list[dict[str, Any]]:
    events = [line.removeprefix(b"data: ") for line in raw.split(b"\n\n") if line.startswith(b"data: {")]
    choices = [json.loads(event)["choices"] for event in events]
    return [choice[0] for choice in choices if choice and "token_ids" in choice[0]]


async def test_a_chunk_carries_up_to_n_tokens_of_one_segment_with_their_ids_and_logprobs() -> None:
    with ScriptedModelServer(Script(steps=[chunked_step()])) as model:
        async with httpx.AsyncClient(timeout=30) as client:
            # Straight to the model (no proxy to override the name): ask for the name it serves, as vLLM requires.
            request = body(model=model.model.model_name, logprobs=True, top_logprobs=5, return_token_ids=True)
            response = await client.post(f"{model.base_url}/chat/completions", json=request)
            assert response.status_code == 200, response.text
            raw = response.content
    tokens = model.exchanges[0].tokens
    chunks = token_chunks(raw)
    assert len(tokens) // 8 < len(chunks) < len(tokens) // 2
    assert all(1 <= len(chunk["token_ids"]) <= 8 for chunk in chunks)
    assert [i for chunk in chunks for i in chunk["token_ids"]] == [t.token_id for t in tokens]
    entries = [entry for chunk in chunks for entry in chunk["logprobs"]["content"]]
    assert [entry["logprob"] for entry in entries] == [t.logprob for t in tokens]
    assert all(len(entry["top_logprobs"]) == 5 for entry in entries)
    for chunk in chunks:
        texts = "".join(entry["token"] for entry in chunk["logprobs"]["content"])
        delta = chunk["delta"]
        assert not ("content" in delta and "tool_calls" in delta), "a chunk holds one segment"
        if "content" in delta:
            assert delta["content"] == texts
    assert "".join(chunk["delta"].get("content", "") for chunk in chunks) == TEXT
    arguments = "".join(
        call["function"].get("arguments", "") for chunk in chunks for call in chunk["delta"].get("tool_calls", [])
    )
    assert arguments == CALL.arguments_json()
    assert [chunk["finish_reason"] for chunk in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]


async def test_the_real_proxy_captures_every_token_of_chunked_answers(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[chunked_step(32)])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, raw = await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    tokens = model.exchanges[0].tokens
    assert response.status_code == 200
    assert raw == bytes(model.exchanges[0].sent)
    assert len(token_chunks(raw)) < len(tokens) // 4
    assert turn.completion_token_ids == [t.token_id for t in tokens]
    assert turn.per_token_logps == [t.logprob for t in tokens]
    assert [[logprob for _, logprob, _ in top] for top in turn.top_logprobs] == [
        [t.logprob] + [logprob for _, _, logprob in t.alternatives] for t in tokens
    ]
    assert (turn.aligned, turn.outcome) == (True, "complete")
    assert turn.response["content"] == TEXT
