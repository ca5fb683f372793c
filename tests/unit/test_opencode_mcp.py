"""A task's MCP servers in OpenCode's config, over generated cases: OpenCode substitutes `{env:...}` and `{file:...}`
in its config's text (its environment holds the proxy's token), so no task string may form one; a remote server's
URL is refused naming it, or lands on the sandbox's loopback."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opencode_env.rollout.opencode import MODEL_KEY_REFERENCE, config_text, render_config
from opencode_env.rollout.opencode_mcp import on_loopback, servers_without_tools
from opencode_env.wire import RolloutRequest
from opencode_env.wire.mcp import McpServer, mcp_problems

OPENCODE_SUBSTITUTION = re.compile(r"\{(?:env|file):[^}]+\}")
"""What OpenCode 1.18 replaces in its config's text before parsing it (tried on the real binary: an MCP server's
argument `{env:X}` arrived as X's value, `{file:/etc/hostname}` as the file's text; `\\u007b` arrived as `{`)."""
words = st.text(st.characters(exclude_characters="\x00\n\r", exclude_categories=("Cs",)), min_size=1, max_size=40)
braced = st.builds(lambda kind, body: f"{{{kind}:{body}}}", st.sampled_from(["env", "file"]), words)
task_words = st.one_of(words, braced, st.builds("".join, st.lists(st.one_of(words, braced), min_size=1, max_size=4)))


def _config(servers: list[McpServer], model_id: str = "policy") -> dict[str, object]:
    return render_config(
        base_url="http://127.0.0.1:9/v1", model_id=model_id, max_tokens_cap=64, model_options={}, mcp_servers=servers
    )


url_words = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#?"), max_size=30)
url_braced = st.builds(lambda kind, body: f"{{{kind}:{body}}}", st.sampled_from(["env", "file"]), url_words)


@settings(max_examples=200, deadline=None)
@given(path=st.lists(st.one_of(url_words, url_braced), max_size=4), model_id=task_words)
def test_no_task_string_forms_a_substitution_opencode_would_make(path: list[str], model_id: str) -> None:
    """A remote server's URL (the task's) and the model's name (a black_box caller's) are any text, braces included."""
    server = McpServer(name="m", transport="streamable-http", url="http://kv:8000/" + "".join(path))
    config = _config([server], model_id)
    text = config_text(config)
    assert json.loads(text) == config, "the text OpenCode parses is the config, every string as it was"
    assert OPENCODE_SUBSTITUTION.findall(text) == [MODEL_KEY_REFERENCE], "ours, once, and nothing else"


hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "kv", "KV", "example.com", "10.0.0.1", "[::1]", ""]), words
)
urls = st.one_of(
    words,
    st.builds(
        lambda scheme, host, port, path: f"{scheme}://{host}{port}{path}",
        st.sampled_from(["http", "https", "ftp", "HTTP"]),
        hosts,
        st.sampled_from(["", ":0", ":8000", ":99999", ":x"]),
        st.sampled_from(["", "/", "/mcp", "/sse?x=1", "/a#f", "/{env:K}"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(url=urls)
def test_a_remote_url_is_refused_naming_it_or_lands_on_the_sandboxs_loopback(url: str) -> None:
    try:
        server = McpServer(name="m", url=url)
    except ValidationError as error:
        refused = str(error)
        assert "url" in refused, refused
        return
    problems = mcp_problems([server], frozenset({"kv"}))
    if problems:
        assert all(problem.startswith("mcp_servers.m.url: ") for problem in problems)
        return
    parts, given_parts = urlsplit(on_loopback(url)), urlsplit(url)
    assert given_parts.hostname == "kv", "a service of the rollout, and nothing else"
    assert (parts.scheme, parts.hostname, parts.port, parts.path) == (
        "http",
        "127.0.0.1",
        given_parts.port,
        given_parts.path,
    )
    text = config_text(_config([server]))
    assert OPENCODE_SUBSTITUTION.findall(text) == [MODEL_KEY_REFERENCE]


def test_names_twice_are_refused() -> None:
    servers = [McpServer(name="m", transport="stdio", command="a"), McpServer(name="m", url="http://kv/")]
    assert mcp_problems(servers, frozenset({"kv"}), agent_runs=False) == ["mcp_servers.m: the name is given twice"]


@pytest.mark.parametrize("name", ["", "a.b", "a b", "-a", "x" * 33, "tool/x"])
def test_a_name_that_is_no_tool_name_prefix_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="name"):
        McpServer(name=name, transport="stdio", command="x")


def test_a_server_is_missing_when_none_of_its_tools_was_sent() -> None:
    servers = [McpServer(name=name, transport="stdio", command="x") for name in ("a", "a_b", "c")]
    sent = [{"type": "function", "function": {"name": name}} for name in ("bash", "a_b_tool", "c_x")]
    assert servers_without_tools(servers, [*sent, "odd", {"function": None}]) == ["a"], "a_b_tool is a_b's"
    assert servers_without_tools(servers, []) == ["a", "a_b", "c"]


@pytest.mark.parametrize(
    ("server", "services", "refusal"),
    [
        ({"name": "m", "transport": "sse", "url": "http://example.com/mcp"}, [], "host 'example.com' is not one of"),
        ({"name": "m", "transport": "sse", "url": "http://10.0.0.1:80/mcp"}, [], "host '10.0.0.1' is not one of"),
        (
            {"name": "m", "url": "http://127.0.0.1:80/mcp"},
            ["kv"],
            r"host '127.0.0.1' is not one of the rollout's services \(kv\)",
        ),
        ({"name": "m", "url": "http://localhost:80/mcp"}, [], "host 'localhost' is not one of the rollout's services"),
        ({"name": "m", "url": "http://KV:80/mcp"}, ["kv", "kb"], None),
        ({"name": "m", "transport": "streamable-http", "url": "https://kv:8/mcp"}, ["kv"], "is not http://"),
        ({"name": "m", "transport": "sse", "url": "http://u:p@kv:8/"}, ["kv"], "no credentials"),
        ({"name": "m", "transport": "stdio"}, [], "mcp_servers.m.command: a stdio server needs"),
        ({"name": "m", "transport": "stdio", "command": "python3"}, [], "mcp_servers.m: stdio MCP servers are not"),
        ({"name": "m", "transport": "stdio", "command": "x", "url": "http://kv/"}, [], "a stdio server has no URL"),
        ({"name": "m", "transport": "sse"}, [], "mcp_servers.m.url: a sse server needs its URL"),
        ({"name": "a.b", "transport": "stdio", "command": "x"}, [], "name"),
        ({"name": "m", "transport": "websocket", "url": "http://kv/"}, [], "transport"),
    ],
)
def test_a_server_the_rollout_cannot_give_is_refused_naming_it(
    server: dict[str, object], services: list[str], refusal: str | None
) -> None:
    image = "localhost/opencode-env-base:bookworm"
    sidecars = [{"name": name, "image": image, "command": ["true"]} for name in services]
    fields = {"instruction": "x", "mcp_servers": [server], "services": sidecars}
    if refusal is None:
        assert RolloutRequest.model_validate(fields).mcp_servers[0].url == server["url"]
        return
    with pytest.raises(ValueError, match=refusal):
        RolloutRequest.model_validate(fields)


def test_an_oracle_run_leaves_a_stdio_server_unused_and_is_not_refused() -> None:
    """No OpenCode starts in an oracle run, so a Harbor task with a stdio server still gets its oracle and do-nothing
    checks (tests/harbor_corpus/mcp-codes)."""
    stdio = {"name": "m", "transport": "stdio", "command": "python3", "args": ["/s.py"]}
    request = RolloutRequest.model_validate({"instruction": "x", "mcp_servers": [stdio], "solution": []})
    assert [server.transport for server in request.mcp_servers] == ["stdio"]
    with pytest.raises(ValueError, match=r"mcp_servers\.m: stdio MCP servers are not supported yet"):
        RolloutRequest.model_validate({"instruction": "x", "mcp_servers": [stdio]})
