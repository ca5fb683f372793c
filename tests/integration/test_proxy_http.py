"""The capture proxy as a real process between a real HTTP client and the scripted model."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, fail, say, stall
from opencode_env.testing.proxy_process import ProxyProcess, running_proxy

VLLM = ("--endpoint-kind", "vllm", "--model-override", "scripted-policy")


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "policy",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 32000,
        "messages": [{"role": "system", "content": "You are a coder."}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
        **extra,
    }


async def post(url: str, payload: dict[str, Any], **headers: str) -> tuple[httpx.Response, bytes]:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{url}/chat/completions", json=payload, headers={"authorization": "Bearer sk-agent-side", **headers}
        )
        return response, response.content


async def test_stream_bytes_reach_the_client_unchanged(tmp_path: Path) -> None:
    text = "unicode \u2028 \u2029 \u0085 é 中文 🚀 done"
    with (
        ScriptedModelServer(Script(steps=[say(text)])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, raw = await post(proxy.url, body(), **{"x-session-id": "ses_abc"})
        assert response.status_code == 200
        assert raw == bytes(model.exchanges[0].sent)
        turn = proxy.wait_for_turns(1).turns[0]
    exchange = model.exchanges[0]
    assert exchange.headers["authorization"] == "Bearer sk-upstream-test"
    assert exchange.headers["x-session-id"] == "ses_abc"
    assert exchange.request["model"] == "scripted-policy"
    assert (exchange.request["max_tokens"], exchange.request["return_token_ids"]) == (4096, True)
    assert turn.response["content"] == text
    assert turn.completion_token_ids == [t.token_id for t in exchange.tokens]
    assert turn.per_token_logps == [t.logprob for t in exchange.tokens]
    assert turn.headers["x-session-id"] == "ses_abc"
    assert turn.headers["authorization"] == "[redacted]"
    assert turn.aligned
    assert turn.ttft_s is not None
    assert 0 < turn.ttft_s <= turn.latency_s


async def test_a_lone_surrogate_from_the_agent_is_forwarded_and_recorded(tmp_path: Path) -> None:
    """JSON allows an escaped lone surrogate, Python's parser keeps it, and encoding it as UTF-8 fails: the proxy
    escapes it on the way out (to the upstream and into the trace) instead of failing the request unrecorded."""
    with (
        ScriptedModelServer(Script(steps=[say("ok")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        raw_request = json.dumps(body()).replace('"hi"', '"half an emoji \\ud83d, then 中文"').encode()
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{proxy.url}/chat/completions", content=raw_request)
        proxy.wait_for(lambda _: b'"type":"turn"' in proxy.trace_path.read_bytes())
        records = [json.loads(line) for line in proxy.trace_path.read_bytes().splitlines()]
    assert response.status_code == 200
    assert model.exchanges[0].request["messages"][1]["content"] == "half an emoji \ud83d, then 中文"
    turn = next(record for record in records if record["type"] == "turn")
    assert turn["outcome"] == "complete"
    assert turn["request"]["messages"][1]["content"] == "half an emoji \ud83d, then 中文"


async def test_non_streamed_requests_are_recorded(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[say("plain")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, raw = await post(proxy.url, body(stream=False))
        assert response.status_code == 200
        assert json.loads(raw)["choices"][0]["message"]["content"] == "plain"
        assert "stream_options" not in model.exchanges[0].request
        turn = proxy.wait_for_turns(1).turns[0]
    assert (turn.stream, turn.outcome, turn.response["content"]) == (False, "complete", "plain")
    assert turn.completion_token_ids == [t.token_id for t in model.exchanges[0].tokens]


async def test_server_errors_pass_through_with_retry_after(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[fail(503, retry_after_s=1.5)])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM) as proxy,
    ):
        response, _raw = await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1.5"
    assert response.headers["retry-after-ms"] == "1500"
    assert (turn.upstream_status, turn.outcome) == (503, "upstream_error")
    assert "scripted failure" in (turn.upstream_error or "")


async def test_client_errors_become_a_neutral_400(tmp_path: Path) -> None:
    script = Script(steps=[fail(422, message="overloaded? no: bad schema")])
    with ScriptedModelServer(script) as model, running_proxy(model.base_url, tmp_path, *VLLM) as proxy:
        response, raw = await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 400
    message = json.loads(raw)["error"]["message"]
    assert "bad schema" in message
    assert "overloaded" not in message
    assert (turn.upstream_status, turn.outcome) == (422, "upstream_error")


async def test_unreachable_upstream_is_a_502(tmp_path: Path) -> None:
    with running_proxy("http://127.0.0.1:9/v1", tmp_path, *VLLM) as proxy:
        response, _ = await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 502
    assert turn.outcome == "unreachable"
    assert turn.upstream_status is None


async def test_a_stall_before_the_first_byte_is_cut_by_the_idle_timeout(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[stall(30)])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--idle-timeout", "1") as proxy,
    ):
        response, _ = await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 504
    assert turn.outcome == "stalled"


async def test_a_stall_mid_stream_is_recorded_with_the_tokens_so_far(tmp_path: Path) -> None:
    with (
        ScriptedModelServer(Script(steps=[stall(30, after_tokens=4)])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--idle-timeout", "1") as proxy,
    ):
        response, raw = await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 200
    assert b"[DONE]" not in raw
    assert turn.outcome == "stalled"
    assert len(turn.completion_token_ids) == 4
    assert turn.completion_token_ids == [t.token_id for t in model.exchanges[0].tokens[:4]]


async def test_an_upstream_that_cuts_the_stream_is_not_a_clean_completion(tmp_path: Path) -> None:
    script = Script(steps=[Step(content="one two three four five", disconnect_after_tokens=3)])
    with ScriptedModelServer(script) as model, running_proxy(model.base_url, tmp_path, *VLLM) as proxy:
        await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert turn.outcome == "upstream_disconnected"
    assert len(turn.per_token_logps) == 3
    assert not turn.aligned


async def test_an_agent_that_disconnects_mid_stream_leaves_a_record(tmp_path: Path) -> None:
    script = Script(steps=[Step(content="word " * 200, token_delay_s=0.01)])
    with ScriptedModelServer(script) as model, running_proxy(model.base_url, tmp_path, *VLLM) as proxy:
        async with (
            httpx.AsyncClient(timeout=30) as client,
            client.stream("POST", f"{proxy.url}/chat/completions", json=body()) as response,
        ):
            received = 0
            async for piece in response.aiter_raw():
                received += len(piece)
                if received > 2000:
                    break
        trace = proxy.wait_for_turns(1)
    turn = trace.turns[0]
    assert turn.outcome == "client_disconnected"
    assert 0 < len(turn.per_token_logps) < 401


@contextmanager
def raw_stream_request(url: str) -> Iterator[socket.socket]:
    """A streamed request POSTed on a plain socket: no client library reads ahead into its own buffers."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    payload = json.dumps(body()).encode()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        yield connection


def _stream_then_close(url: str, *, read_to_the_end: bool, proxy: ProxyProcess) -> None:
    """Close the connection once the proxy has relayed the whole response: read to its end, or every byte unread."""
    with raw_stream_request(url) as connection:
        received = b""
        while read_to_the_end and not received.endswith(b"0\r\n\r\n"):
            received += connection.recv(65536)
        proxy.wait_for_turns(1)


@pytest.mark.parametrize("read_to_the_end", [False, True], ids=["unread", "read"])
async def test_a_response_relayed_whole_but_never_read_is_not_complete(tmp_path: Path, read_to_the_end: bool) -> None:
    script = Script(steps=[Step(content="word " * 60)])
    with ScriptedModelServer(script) as model, running_proxy(model.base_url, tmp_path, *VLLM) as proxy:
        await asyncio.to_thread(_stream_then_close, proxy.url, read_to_the_end=read_to_the_end, proxy=proxy)
        trace = proxy.wait_for(lambda trace: trace.turns[0].outcome != "complete", timeout_s=3)
        sent, tokens = len(model.exchanges[0].sent), [t.token_id for t in model.exchanges[0].tokens]
    turn = trace.turns[0]
    if read_to_the_end:
        assert turn.outcome == "complete"
    else:
        assert turn.outcome == "undelivered"
        assert f"({sent} bytes relayed)" in (turn.upstream_error or "")
    assert turn.completion_token_ids == tokens


async def test_every_request_leaves_a_record_even_a_bad_one(tmp_path: Path) -> None:
    with running_proxy("http://127.0.0.1:9/v1", tmp_path) as proxy:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{proxy.url}/chat/completions", content=b"{not json")
            health = (await client.get(proxy.url.removesuffix("/v1") + "/healthz")).json()
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 400
    assert turn.outcome == "bad_request"
    assert health["ok"] is True


async def test_the_proxy_s_own_routes_answer_unknown_paths_and_methods_as_http_says(tmp_path: Path) -> None:
    with running_proxy("http://127.0.0.1:9/v1", tmp_path) as proxy:
        root = proxy.url.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=30) as client:
            missing = await client.get(f"{root}/admin")
            wrong_method = await client.get(f"{root}/drain")
            drained = await client.post(f"{root}/drain")
    assert missing.status_code == 404
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    assert drained.json() == {"turns_written": 0}


@pytest.mark.parametrize("top", [0, 3])
async def test_top_logprobs_follow_the_setting(tmp_path: Path, top: int) -> None:
    with (
        ScriptedModelServer(Script(steps=[say("a b c")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--top-logprobs", str(top)) as proxy,
    ):
        await post(proxy.url, body())
        turn = proxy.wait_for_turns(1).turns[0]
    assert model.exchanges[0].request["top_logprobs"] == top
    assert {len(alternatives) for alternatives in turn.top_logprobs} == {top}


async def test_a_drain_waits_for_a_relay_whose_agent_is_still_going_away(tmp_path: Path) -> None:
    script = Script(steps=[Step(content="word " * 400, token_delay_s=0.05)])
    with ScriptedModelServer(script) as model, running_proxy(model.base_url, tmp_path, *VLLM) as proxy:
        with raw_stream_request(proxy.url) as connection:
            assert b"200" in connection.recv(65536)
            async with httpx.AsyncClient(timeout=30) as client:
                drain = asyncio.ensure_future(client.post(proxy.url.removesuffix("/v1") + "/drain"))
                await asyncio.sleep(1.0)
                assert not drain.done()
                connection.close()
                answer = await asyncio.wait_for(drain, 10)
        assert answer.json()["turns_written"] == 1
        assert proxy.trace().turns[0].outcome == "client_disconnected"


async def test_a_body_over_the_limit_is_refused_unread_and_recorded_as_the_agents(tmp_path: Path) -> None:
    """A chunked body of 64 MB against a 1 MB limit: 413 without reading it all, a bad_request turn, and the model
    never called; the next request of normal size goes through."""
    limit = ("--max-request-bytes", str(2**20))

    async def flood() -> Any:
        yield b'{"model": "policy", "messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * 2**20

    with (
        ScriptedModelServer(Script(steps=[say("fine")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, *limit) as proxy,
    ):
        async with httpx.AsyncClient(timeout=30) as client:
            refused = await client.post(f"{proxy.url}/chat/completions", content=flood())
        response, _ = await post(proxy.url, body(stream=False))
        trace = proxy.wait_for_turns(2)
    assert refused.status_code == 413
    assert response.status_code == 200
    assert [exchange.request["messages"][-1]["content"] for exchange in model.exchanges] == ["hi"]
    refused_turn = trace.turns[0] if trace.turns[0].outcome == "bad_request" else trace.turns[1]
    assert refused_turn.outcome == "bad_request"
    assert "over the proxy's limit of 1048576 bytes" in (refused_turn.upstream_error or "")


async def test_the_callers_sampling_reaches_the_model_and_the_record(tmp_path: Path) -> None:
    sampling = {"temperature": 0.6, "top_p": 0.95, "seed": 7, "stop": ["END"]}
    with (
        ScriptedModelServer(Script(steps=[say("sampled")])) as model,
        running_proxy(model.base_url, tmp_path, *VLLM, "--sampling", json.dumps(sampling)) as proxy,
    ):
        response, _ = await post(proxy.url, body(stream=False, temperature=1.5))
        turn = proxy.wait_for_turns(1).turns[0]
    assert response.status_code == 200
    sent = model.exchanges[0].request
    assert {name: sent[name] for name in sampling} == sampling
    assert {name: turn.request[name] for name in sampling} == sampling


async def test_the_proxy_connects_to_the_vetted_address_and_names_the_host_it_was_given(tmp_path: Path) -> None:
    """A caller's URL is checked once by the server; the proxy connects to that address, never resolving the name
    again (here a name that resolves nowhere), and still sends it as the Host."""
    with ScriptedModelServer(Script(steps=[say("pinned")])) as model:
        named = model.base_url.replace("127.0.0.1", "model.invalid")
        with running_proxy(named, tmp_path, *VLLM, "--upstream-address", "127.0.0.1") as proxy:
            response, _ = await post(proxy.url, body(stream=False))
    assert response.status_code == 200
    assert model.exchanges[0].headers["host"] == named.removeprefix("http://").split("/")[0]


async def test_a_body_nested_200000_deep_is_a_400(tmp_path: Path) -> None:
    deep = b'{"model": "m", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with running_proxy("http://127.0.0.1:9/v1", tmp_path) as proxy:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{proxy.url}/chat/completions", content=deep)
            health = (await client.get(proxy.url.removesuffix("/v1") + "/healthz")).json()
    assert response.status_code == 400
    assert health["ok"] is True
