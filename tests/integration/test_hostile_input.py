"""Random and hostile arguments thrown at the tool through a real server (property-based)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest
from opencode_env.wire.answer import inline_result
from tests.helpers import idle_model_url
from tests.server_app import app_for

HOSTILE_TEXT = [
    "../../etc/passwd",
    "/etc/shadow",
    "a" * 300_000,
    "\x00",
    "$(rm -rf /)",
    "'; DROP TABLE x; --",
    "\u2028",
    "http://169.254.169.254/latest/meta-data",
    "file:///etc/passwd",
    "🚀" * 1000,
    " ",
    "\ud800",
]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=200)
    | st.sampled_from(HOSTILE_TEXT),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=30), children, max_size=5),
    max_leaves=15,
)
ARGUMENTS = st.dictionaries(
    st.sampled_from(list(RolloutRequest.model_fields)) | st.text(max_size=30), JSON_VALUES, max_size=8
)


@pytest.fixture(scope="module")
def stub_server() -> Iterator[tuple[str, StubBackend]]:
    stub = StubBackend()
    server = ThreadedServer(app_for(stub))  # type: ignore[arg-type]
    server.start()
    yield server.url, stub
    server.stop()


def call_tool(url: str, arguments: dict[str, Any]) -> dict[str, Any]:
    payload = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "run_rollout", "arguments": arguments},
    }
    response = httpx.post(
        f"{url}/mcp/stream",
        content=json.dumps(payload, ensure_ascii=True),
        headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
        timeout=60,
    )
    assert response.status_code in (200, 400), response.text[:500]
    for line in response.text.split("\n"):  # not splitlines(): answers carry unescaped U+0085 and U+2028
        if line.startswith("data:"):
            answer: dict[str, Any] = json.loads(line[5:])
            return answer
    parsed: dict[str, Any] = response.json()
    return parsed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=ARGUMENTS)
def test_the_server_answers_every_argument_set_with_a_result_or_a_clear_error(
    stub_server: tuple[str, StubBackend], arguments: dict[str, Any]
) -> None:
    url, stub = stub_server
    answer = call_tool(url, arguments)
    if "error" in answer:
        assert answer["error"]["message"]
        return
    result = answer["result"]
    if result.get("isError"):
        text = " ".join(part.get("text", "") for part in result["content"])
        assert len(text) > 10
        return
    parsed = inline_result(result["structuredContent"])
    assert parsed.status in ("invalid_request", "completed", "agent_error")
    assert stub.alive == set()


def test_the_server_stays_healthy_after_the_barrage(stub_server: tuple[str, StubBackend]) -> None:
    url, stub = stub_server
    assert httpx.get(f"{url}/health").status_code == 200
    answer = call_tool(
        url,
        {
            "instruction": "x",
            "base_url": idle_model_url(),
            "model": "m",
            "mode": "black_box",
            "verify": ["true"],
        },
    )
    assert inline_result(answer["result"]["structuredContent"]).backend == "stub"
    assert stub.alive == set()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"instruction": ""}, "instruction"),
        ({"instruction": "x", "top_logprobs": 21}, "top_logprobs"),
        ({"instruction": "x", "files": {"../up.txt": "x"}}, "files"),
        ({"instruction": "x", "env": {"PATH": "/evil"}}, "env"),
        ({"instruction": "x", "mode": "grey_box"}, "mode"),
        ({"instruction": "x", "agent_timeout_s": -1}, "agent_timeout_s"),
        ({"instruction": "x", "task_id": "has spaces"}, "task_id"),
        ({"instruction": "x", "setup": ["x" * 16_001]}, "setup"),
    ],
)
def test_each_violation_names_the_field(
    stub_server: tuple[str, StubBackend], arguments: dict[str, Any], named: str
) -> None:
    url, _ = stub_server
    result = call_tool(url, arguments)["result"]
    assert result["isError"]
    assert named in result["content"][0]["text"]


@pytest.mark.parametrize("path", ["/mcp", "/mcp/stream"])
def test_a_body_nested_200000_deep_is_a_client_error(stub_server: tuple[str, StubBackend], path: str) -> None:
    url, _ = stub_server
    deep = "[" * 200_000 + "]" * 200_000
    for body in (deep, '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + deep + "}"):
        response = httpx.post(
            f"{url}{path}",
            content=body,
            headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
            timeout=60,
        )
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
