"""A real rollout of 50k+ sampled tokens with top-5 alternatives reaches its caller whole: the official MCP Python
SDK's streamable HTTP client at its defaults (an answer under 1 MiB, then the result by `resources/read` and by the
linked route) and `OpenCodeEnv.run_rollout` (its answer over /ws, the result by reference). Every sampled token's id
and logprob, and every alternative, is what the scripted model sent, bit for bit.

Everything is real: the server on loopback, the local backend, OpenCode, the capture proxy, the scripted model
(two turns of ~26k tokens, 32 tokens per streamed chunk). Two rollouts, side by side, once for the module: one per
client, since `OpenCodeEnv` runs its own rollout and cannot read another's result."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
from array import array
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from mcp.client.client import Client as SdkClient

from opencode_env.client.client import OpenCodeEnv
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import Exchange, ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.result_store import GZIP_LEVEL
from opencode_env.wire import SCHEMA_VERSION, UNPACKED_CONTEXT, RolloutRequest, RolloutResult
from opencode_env.wire.answer import RolloutAnswer
from tests.conftest import processes_mentioning
from tests.server_app import app_for

TURNS = 2
WORDS_PER_TURN = 13_200
"""Two tokens a word (the word, the space): ~26.4k sampled tokens a turn, under the turn's max_tokens."""
TOP_K = 5
EVENT_LIMIT = 1024 * 1024
"""The MCP SDK's and fastmcp's default limit on one server-sent event: the answer must fit it."""
# Deadlines live in the requests (the agent's 900 s); the test's own timeout only backs them up.
pytestmark = pytest.mark.timeout(2400)


def long_text(turn: int) -> str:
    return " ".join(f"w{(index * 7 + turn) % 211}" for index in range(WORDS_PER_TURN))


def long_script() -> Script:
    """Each turn says a long text; all but the last then run a command, so that the agent asks again."""
    steps = [
        Step(
            content=long_text(turn),
            tool_calls=[] if turn == TURNS - 1 else [ToolCallStep(name="bash", arguments={"command": f"echo {turn}"})],
            tokens_per_chunk=32,
        )
        for turn in range(TURNS)
    ]
    return Script(steps=steps, title="Long answers")


def long_request(base_url: str, task_id: str) -> RolloutRequest:
    return demo_request(
        base_url,
        task_id=task_id,
        instruction="Say two long texts, running a command after the first.",
        verify=["echo 1 > /home/user/logs/verifier/reward.txt"],
        top_logprobs=TOP_K,
        max_tokens_cap=32_768,
        agent_timeout_s=900,
    )


@dataclass
class SentToken:
    token_id: int
    logprob: float
    top: list[tuple[str, float]]


def sent_tokens(exchange: Exchange) -> list[SentToken]:
    """The sampled tokens as the scripted model's bytes on the wire said them (not as any capture recorded them)."""
    tokens: list[SentToken] = []
    for event in bytes(exchange.sent).split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        for choice in json.loads(event.removeprefix(b"data: "))["choices"]:
            entries = (choice.get("logprobs") or {}).get("content") or []
            ids = choice.get("token_ids") or []
            assert len(ids) == len(entries)
            tokens += [
                SentToken(i, e["logprob"], [(a["token"], a["logprob"]) for a in e["top_logprobs"]])
                for i, e in zip(ids, entries, strict=True)
            ]
    return tokens


@dataclass
class Delivered:
    """What each client received, and what the scripted model sent in each agent session."""

    answer_json: bytes
    answer: RolloutAnswer
    by_resources: bytes
    by_route: bytes
    via_env: RolloutResult
    sent: dict[str, list[list[SentToken]]]


async def through_the_mcp_sdk(url: str, request: RolloutRequest) -> tuple[bytes, RolloutAnswer, bytes, bytes]:
    async with SdkClient(f"{url}/mcp") as client:
        called = await client.call_tool("run_rollout", request.model_dump(mode="json"))
        answer_json = called.model_dump_json(by_alias=True, exclude_none=True).encode()
        answer = RolloutAnswer.model_validate(called.structured_content)
        assert answer.result_ref is not None, answer
        stream = b""
        for uri in answer.result_ref.resources:
            (part,) = (await client.read_resource(uri)).contents
            stream += base64.b64decode(part.blob)  # type: ignore[union-attr]
    async with httpx.AsyncClient(timeout=120) as http:
        linked = await http.get(answer.result_ref.url)
    linked.raise_for_status()
    assert linked.headers["content-encoding"] == "gzip"
    return answer_json, answer, stream, linked.content  # httpx gunzips it


async def through_opencode_env(url: str, request: RolloutRequest) -> RolloutResult:
    async with OpenCodeEnv(base_url=url) as env:
        return await env.run_rollout(request)


@pytest.fixture(scope="module")
async def delivered(backend: LocalBackend) -> Delivered:
    server = ThreadedServer(app_for(backend, max_rollouts=2))
    server.start()
    try:
        with ScriptedModelServer(long_script(), float32_logprobs=True) as model:
            (answer_json, answer, by_resources, by_route), via_env = await asyncio.gather(
                through_the_mcp_sdk(server.url, long_request(model.base_url, "at_size_mcp_sdk")),
                through_opencode_env(server.url, long_request(model.base_url, "at_size_opencode_env")),
            )
            sent: dict[str, list[list[SentToken]]] = defaultdict(list)
            for exchange in model.exchanges:
                sent[exchange.headers.get("x-session-id", "")].append(sent_tokens(exchange))
    finally:
        server.stop()
    return Delivered(answer_json, answer, by_resources, by_route, via_env, dict(sent))


def assert_as_sent(result: RolloutResult, sent: dict[str, list[list[SentToken]]]) -> None:
    """Every turn of the result holds the tokens the scripted model sent in its session: ids, logprobs bit for bit,
    and the top-5 alternatives (text and logprob) in their order."""
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    session = result.proxy_turns[0].headers["x-session-id"]
    turns = sent[session]
    assert len(result.proxy_turns) == len(turns) == TURNS
    for turn, tokens in zip(result.proxy_turns, turns, strict=True):
        assert turn.headers["x-session-id"] == session
        assert (turn.aligned, turn.outcome) == (True, "complete")
        assert turn.completion_token_ids == [token.token_id for token in tokens]
        assert array("d", turn.per_token_logps).tobytes() == array("d", [t.logprob for t in tokens]).tobytes()
        got = [[(text, logprob) for text, logprob, _ in position] for position in turn.top_logprobs]
        assert got == [token.top for token in tokens]
        assert {len(position) for position in got} == {TOP_K}
        got_bits = array("d", [logprob for position in got for _, logprob in position]).tobytes()
        assert got_bits == array("d", [logprob for t in tokens for _, logprob in t.top]).tobytes()
    assert sum(len(tokens) for tokens in turns) >= 50_000


def test_the_mcp_sdk_at_its_defaults_gets_an_answer_under_1_mib_without_the_tokens(delivered: Delivered) -> None:
    answer = delivered.answer
    assert len(delivered.answer_json) < EVENT_LIMIT
    assert (answer.status, answer.reward, answer.turns) == ("completed", 1.0, TURNS), answer.error
    assert answer.sampled_tokens >= 50_000
    assert answer.result is None, "a result this size is by reference only"
    assert answer.result_ref is not None
    assert answer.result_ref.json_bytes > EVENT_LIMIT


def test_the_mcp_sdk_reads_the_whole_result_by_resources_and_by_the_linked_route(delivered: Delivered) -> None:
    ref = delivered.answer.result_ref
    assert ref is not None
    result_json = gzip.decompress(delivered.by_resources)
    assert delivered.by_route == result_json
    assert (len(result_json), hashlib.sha256(result_json).hexdigest()) == (ref.json_bytes, ref.sha256)
    result = RolloutResult.model_validate_json(result_json)
    assert result.task_id == "at_size_mcp_sdk"
    assert_as_sent(result, delivered.sent)


def test_opencode_env_gets_the_whole_result(delivered: Delivered) -> None:
    result = delivered.via_env
    assert result.task_id == "at_size_opencode_env"
    assert_as_sent(result, delivered.sent)


def test_the_two_rollouts_ran_in_their_own_sessions_and_left_nothing(delivered: Delivered, sandbox_base: Path) -> None:
    assert len(delivered.sent) == 2
    assert list(sandbox_base.iterdir()) == []
    assert processes_mentioning(str(sandbox_base)) == []


def test_a_real_capture_names_alternatives_by_text_and_its_turns_travel_packed(delivered: Delivered) -> None:
    """An OpenAI-compatible server (vLLM included, unless asked for `return_tokens_as_token_ids`) names the top
    alternatives by text only: schema 6 packs them as indices into a table of texts, so the whole result of 52.8k
    sampled tokens (float32 logprobs, as vLLM computes them) is under the issue's 64 bytes per sampled token as
    JSON, and reads back bit for bit (the tests above check the very same bytes). Printed beside it: the same
    result as version 3's lists, which is what schema 5 sent for such turns."""
    turns = delivered.via_env.proxy_turns
    assert {token_id for turn in turns for position in turn.top_logprobs for _, _, token_id in position} == {None}
    result_json = gzip.decompress(delivered.by_resources)
    wire = json.loads(result_json)
    assert wire["schema_version"] == SCHEMA_VERSION == 6
    packed = [turn["packed"] for turn in wire["proxy_turns"]]
    shapes = [(p["top_k"], p["float"], p["top_ids"], p["top_texts"] != "") for p in packed]
    assert shapes == [(TOP_K, "f32", "", True)] * TURNS
    assert [(turn["completion_token_ids"], turn["top_logprobs"]) for turn in wire["proxy_turns"]] == [([], [])] * TURNS
    sampled = sum(p["count"] for p in packed)
    as_lists = RolloutResult.model_validate_json(result_json).model_dump_json(context={UNPACKED_CONTEXT: True})
    lists_gzipped = gzip.compress(as_lists.encode(), compresslevel=GZIP_LEVEL)
    figures = {
        "schema 6 packed": (len(result_json), len(delivered.by_resources)),
        "version 3 lists (what schema 5 sent)": (len(as_lists), len(lists_gzipped)),
    }
    for name, (plain, gzipped) in figures.items():
        print(
            f"{name}: {sampled} sampled tokens, {plain} B of JSON ({plain / sampled:.1f} B/token), "
            f"{gzipped} B gzip'd ({gzipped / sampled:.1f} B/token)"
        )
    assert len(result_json) / sampled <= 64
