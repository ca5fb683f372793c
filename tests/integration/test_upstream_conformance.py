"""The proxy's own HTTP/1.1 client against real servers on loopback: uvicorn (h11 and httptools) and aiohttp, plain
and over TLS from a CA made for the run, directly and through a real HTTP proxy; and how it reads the proxy
variables. Nothing leaves the machine: every server and the proxy listen on 127.0.0.1, and the proxy refuses any
other target."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop

from opencode_env.proxy.upstream import (
    Origin,
    ProxyRoute,
    UpstreamDisconnected,
    UpstreamPool,
    UpstreamResponse,
    UpstreamStalled,
    UpstreamUnreachable,
    proxy_route,
)
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from tests.upstream_proxy import running_test_proxy
from tests.upstream_servers import PIECES, SERVER_KINDS, PrivateCA, ServerKind, served

KEY = "Bearer sk-upstream-secret"
HEADERS = {"content-type": "application/json", "authorization": KEY}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> PrivateCA:
    return PrivateCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def trusting(ca: PrivateCA, monkeypatch: pytest.MonkeyPatch) -> PrivateCA:
    """The test CA as the default verify paths' bundle (SSL_CERT_FILE, as an operator with a private CA sets it)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.bundle))
    return ca


def pool(url: str, *, route: ProxyRoute | None = None, idle_s: float = 10.0) -> UpstreamPool:
    return UpstreamPool(Origin.parse(url), connect_timeout_s=5, idle_timeout_s=idle_s, route=route)


async def post(upstream: UpstreamPool, path: str, body: bytes = b'{"x": 1}') -> tuple[int, dict[str, str], bytes]:
    response = await upstream.post(path, body, HEADERS)
    return response.status, response.headers, await response.read()


async def pieces_of(upstream: UpstreamPool, path: str) -> list[bytes]:
    response = await upstream.post(path, b"{}", HEADERS)
    assert response.headers["transfer-encoding"].lower() == "chunked"
    return [piece async for piece in response.iter_body()]


async def collect(response: UpstreamResponse, received: list[bytes]) -> None:
    """The body's pieces into `received`, as they arrive (they stay there when the body fails)."""
    async for piece in response.iter_body():
        received.append(piece)


@pytest.fixture(params=SERVER_KINDS)
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    kind: ServerKind = request.param
    with served(kind) as url:
        yield url


async def test_a_content_length_body_and_the_request_as_the_server_saw_it(server: str) -> None:
    upstream = pool(server)
    status, headers, raw = await post(upstream, "/echo", b'{"prompt": "\xc3\xa9"}')
    seen = json.loads(raw)
    assert (status, int(headers["content-length"]), len(raw)) == (200, len(raw), len(raw))
    assert (seen["method"], seen["path"], seen["body"]) == ("POST", "/v1/echo", '{"prompt": "é"}')
    sent = {name.lower(): value for name, value in seen["headers"]}
    assert sent["host"] == server.split("/")[2]
    assert sent["authorization"] == KEY
    upstream.close()


async def test_a_chunked_body_arrives_whole_and_in_order(server: str) -> None:
    upstream = pool(server)
    assert b"".join(await pieces_of(upstream, "/stream")) == b"".join(PIECES)
    upstream.close()


async def test_keep_alive_reuses_one_connection(server: str) -> None:
    upstream = pool(server)
    peers = [json.loads((await post(upstream, "/echo"))[2])["peer"] for _ in range(2)]
    await pieces_of(upstream, "/stream")
    peers.append(json.loads((await post(upstream, "/echo"))[2])["peer"])
    assert len(set(peers)) == 1
    upstream.close()


async def test_a_server_that_drops_the_connection_mid_answer_is_a_disconnect(server: str) -> None:
    upstream = pool(server)
    response = await upstream.post("/cut", b"{}", HEADERS)
    received: list[bytes] = []
    with pytest.raises(UpstreamDisconnected, match="broke mid-answer"):
        await collect(response, received)
    assert b"".join(received) == b"".join(PIECES[:2])
    assert (await post(upstream, "/echo"))[0] == 200
    upstream.close()


async def test_a_stalled_server_is_caught_by_the_idle_watchdog(server: str) -> None:
    upstream = pool(server, idle_s=0.3)
    response = await upstream.post("/stall", b"{}", HEADERS)
    received: list[bytes] = []
    with pytest.raises(UpstreamStalled, match=r"no bytes from 127\.0\.0\.1:\d+ for 0\.3s"):
        await collect(response, received)
    assert received == PIECES[:1]
    with pytest.raises(UpstreamStalled, match="no answer from"):
        await upstream.post("/stall-head", b"{}", HEADERS)
    assert (await post(upstream, "/echo"))[0] == 200
    upstream.close()


@pytest.mark.parametrize("kind", SERVER_KINDS)
async def test_tls_from_a_private_ca(kind: ServerKind, trusting: PrivateCA) -> None:
    with served(kind, trusting) as url:
        upstream = pool(url)
        peers = [json.loads((await post(upstream, "/echo"))[2])["peer"] for _ in range(2)]
        assert b"".join(await pieces_of(upstream, "/stream")) == b"".join(PIECES)
        upstream.close()
    assert peers[0] == peers[1]


async def test_tls_to_a_server_of_an_unknown_ca_is_unreachable(ca: PrivateCA) -> None:
    with served("uvicorn-h11", ca) as url, pytest.raises(UpstreamUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        await pool(url).post("/echo", b"{}", HEADERS)


async def test_chunk_extensions_and_trailers_and_the_connection_after_them() -> None:
    """No server above sends chunk extensions or trailers: a hand-written one does, twice on one connection."""
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n6;x\r\n world\r\n0\r\n"
    answer += b"x-checksum: abc\r\nx-more: 1\r\n\r\n"
    connections = 0

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            writer.write(answer)
            await writer.drain()

    server = await asyncio.start_server(respond, "127.0.0.1", 0)
    upstream = pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1")
    bodies = [(await post(upstream, "/x"))[2] for _ in range(2)]
    upstream.close()
    server.close()
    assert bodies == [b"hello world"] * 2
    assert connections == 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_https_through_a_connect_tunnel(loop: str, trusting: PrivateCA) -> None:
    with (
        served("uvicorn-httptools", trusting) as url,
        running_test_proxy(credentials="me:p@ss word") as (proxy_url, proxy),
    ):
        route = ProxyRoute.parse(proxy_url.replace("://", "://me:p%40ss%20word@"))

        async def scenario() -> tuple[list[int], bytes]:
            upstream = pool(url, route=route)
            peers = [json.loads((await post(upstream, "/echo"))[2])["peer"] for _ in range(2)]
            streamed = b"".join(await pieces_of(upstream, "/stream"))
            await upstream.aclose()
            return peers, streamed

        peers, streamed = await on_loop(loop, scenario)
    assert streamed == b"".join(PIECES)
    assert peers[0] == peers[1]
    assert proxy.connections == 1
    (connect,) = proxy.connect_heads()
    port = url.split(":")[2].split("/")[0]
    assert connect.startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n".encode())
    assert b"proxy-authorization: Basic bWU6cEBzcyB3b3Jk\r\n" in connect
    assert b"sk-upstream-secret" not in connect
    assert b"authorization: Bearer" not in connect.lower()


async def test_the_proxy_is_asked_for_the_vetted_address_and_tls_checks_the_name(trusting: PrivateCA) -> None:
    """The server resolved and checked a caller's host: the proxy must not resolve it again (a rebinding window)."""
    with served("uvicorn-h11", trusting) as url, running_test_proxy() as (proxy_url, proxy):
        port = int(url.split(":")[2].split("/")[0])
        origin = Origin("https", "localhost", port, "/v1", connect_address="127.0.0.1")
        upstream = UpstreamPool(origin, connect_timeout_s=5, idle_timeout_s=5, route=ProxyRoute.parse(proxy_url))
        seen = json.loads((await post(upstream, "/echo"))[2])
        await upstream.aclose()
    assert proxy.connect_heads()[0].startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n".encode())
    assert {name.lower(): value for name, value in seen["headers"]}["host"] == f"localhost:{port}"


async def test_http_through_the_proxy_in_absolute_form() -> None:
    with served("uvicorn-h11") as url, running_test_proxy(credentials="me:pw") as (proxy_url, proxy):
        upstream = pool(url, route=ProxyRoute.parse(proxy_url.replace("://", "://me:pw@")))
        seen = [json.loads((await post(upstream, "/echo"))[2]) for _ in range(2)]
        upstream.close()
    first = proxy.heads[0]
    assert first.startswith(f"POST {url}/echo HTTP/1.1\r\n".encode())
    assert b"proxy-authorization: Basic bWU6cHc=\r\n" in first
    assert seen[0]["path"] == "/v1/echo"
    assert "proxy-authorization" not in {name.lower() for name, _ in seen[0]["headers"]}
    assert proxy.connections == 1
    assert seen[0]["peer"] == seen[1]["peer"]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_https_through_an_https_proxy(loop: str, trusting: PrivateCA) -> None:
    """TLS to the proxy, and TLS to the origin inside it."""
    with (
        served("aiohttp", trusting) as url,
        running_test_proxy(tls=trusting.server_context()) as (proxy_url, proxy),
    ):

        async def scenario() -> bytes:
            upstream = pool(url, route=ProxyRoute.parse(proxy_url))
            streamed = b"".join(await pieces_of(upstream, "/stream"))
            await upstream.aclose()
            return streamed

        assert await on_loop(loop, scenario) == b"".join(PIECES)
    assert len(proxy.connect_heads()) == 1


async def test_the_proxys_failures_name_the_proxy_and_never_its_password(trusting: PrivateCA) -> None:
    with served("uvicorn-h11", trusting) as url, running_test_proxy(credentials="me:right") as (proxy_url, _):
        wrong = pool(url, route=ProxyRoute.parse(proxy_url.replace("://", "://me:wrong@")))
        with pytest.raises(UpstreamUnreachable) as refused:
            await wrong.post("/echo", b"{}", HEADERS)
        assert str(refused.value) == f"the proxy {proxy_url} answered 407 to CONNECT {url.split('/')[2]}"
        nowhere = ProxyRoute.parse(f"http://me:wrong@127.0.0.1:{closed_port()}")
        with pytest.raises(UpstreamUnreachable, match=f"through the proxy {nowhere.name}: ConnectionRefused"):
            await pool(url, route=nowhere).post("/", b"", {})
        cut = await pool(url, route=ProxyRoute.parse(proxy_url.replace("://", "://me:right@"))).post("/cut", b"", {})
        with pytest.raises(UpstreamDisconnected, match=f"through the proxy {proxy_url}") as disconnected:
            await cut.read()
    messages = str(disconnected.value) + str(refused.value)
    assert "wrong" not in messages
    assert "sk-upstream-secret" not in messages
    assert "wrong" not in repr(ProxyRoute.parse("http://me:wrong@proxy:3128"))


async def test_no_proxy_bypasses_the_proxy(trusting: PrivateCA) -> None:
    with served("uvicorn-h11", trusting) as url, running_test_proxy() as (proxy_url, proxy):
        origin = Origin.parse(url)
        route = proxy_route(origin, {"https_proxy": proxy_url, "NO_PROXY": "example.com, 127.0.0.0/8"})
        assert route is None
        upstream = pool(url, route=route)
        assert (await post(upstream, "/echo"))[0] == 200
        upstream.close()
    assert proxy.connections == 0


async def test_the_pools_default_route_reads_the_reserved_names_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollout's caller sets the cloud proxy's environment, but no OPENCODE_* name."""
    origin = Origin.parse("https://api.example.com/v1")
    monkeypatch.setenv("HTTPS_PROXY", "http://caller-chosen:80")
    monkeypatch.setenv("https_proxy", "http://caller-chosen:80")
    assert UpstreamPool(origin, connect_timeout_s=1, idle_timeout_s=1).route is None
    monkeypatch.setenv("OPENCODE_ENV_HTTPS_PROXY", "http://operator:3128")
    assert UpstreamPool(origin, connect_timeout_s=1, idle_timeout_s=1).route == ProxyRoute("http", "operator", 3128)
    monkeypatch.setenv("OPENCODE_ENV_NO_PROXY", ".example.com")
    assert UpstreamPool(origin, connect_timeout_s=1, idle_timeout_s=1).route is None


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        ("https://a.test/v1", {"HTTPS_PROXY": "proxy:3128"}, "http://proxy:3128"),
        ("https://a.test/v1", {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:2"}, "http://lower:1"),
        ("https://a.test/v1", {"https_proxy": " ", "HTTPS_PROXY": "http://upper:2"}, "http://upper:2"),
        ("https://a.test/v1", {"HTTP_PROXY": "http://plain:1"}, None),
        ("http://a.test/v1", {"HTTP_PROXY": "http://plain:1", "HTTPS_PROXY": "http://tls:2"}, "http://plain:1"),
        ("http://a.test/v1", {"http_proxy": "https://secure"}, "https://secure:443"),
        ("http://a.test/v1", {"http_proxy": "http://p"}, "http://p:80"),
        ("https://a.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
        ("https://a.test/v1", {"HTTPS_PROXY": "http://p:1", "no_proxy": "b.test,a.test"}, None),
        ("https://x.a.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".a.test"}, None),
        ("https://x.a.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.a.test"}, None),
        ("https://x.a.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "A.TEST."}, None),
        ("https://xa.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "a.test"}, "http://p:1"),
        ("https://a.test:8443/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "a.test:8443"}, None),
        ("https://a.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "a.test:8443"}, "http://p:1"),
        ("https://10.1.2.3/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
        ("https://10.1.2.3/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3"}, None),
        ("https://11.1.2.3/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "http://p:1"),
        ("https://[::1]:8443/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "::1"}, None),
        ("https://[fd00::5]/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "fd00::/8"}, None),
        ("https://[::1]:8443/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "[::1]:8443"}, None),
        ("https://a.test/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8,,"}, "http://p:1"),
    ],
)
def test_proxy_route_reads_the_variables_as_curl_and_requests_do(
    url: str, environ: dict[str, str], expected: str | None
) -> None:
    route = proxy_route(Origin.parse(url), environ)
    assert (route.name if route else None) == expected


def test_proxy_route_with_a_prefix_reads_only_the_upper_case_reserved_names() -> None:
    origin = Origin.parse("https://a.test/v1")
    assert proxy_route(origin, {"opencode_env_https_proxy": "http://p:1"}, prefix="OPENCODE_ENV_") is None
    environ = {"OPENCODE_ENV_HTTPS_PROXY": "http://p:1", "no_proxy": "*"}
    assert proxy_route(origin, environ, prefix="OPENCODE_ENV_") == ProxyRoute("http", "p", 1)


def test_proxy_urls() -> None:
    route = ProxyRoute.parse("http://us%40er:p%3Ass@[::1]:3128/ignored")
    assert (route.host, route.port, route.name) == ("::1", 3128, "http://[::1]:3128")
    assert route.authorization == "Basic dXNAZXI6cDpzcw=="
    assert ProxyRoute.parse("http://user@p").authorization == "Basic dXNlcjo="
    with pytest.raises(ValueError, match="unsupported proxy scheme 'socks5'"):
        ProxyRoute.parse("socks5://p:1080")
    with pytest.raises(ValueError, match="port"):
        ProxyRoute.parse("http://user:secret@p:notaport")
    with pytest.raises(ValueError, match="no host"):
        ProxyRoute.parse("http://:8080")


def test_a_malformed_proxy_variable_is_named_and_its_password_is_not() -> None:
    with pytest.raises(ValueError, match=r"^https_proxy: unsupported proxy scheme 'socks5h'") as raised:
        proxy_route(Origin.parse("https://a.test/v1"), {"https_proxy": "socks5h://me:secret@p:1080"})
    assert "secret" not in str(raised.value)


def test_an_ipv6_origin_is_bracketed_in_host_and_connect() -> None:
    origin = Origin.parse("https://[::1]:8443/v1")
    assert (origin.host_header, origin.target) == ("[::1]:8443", "[::1]:8443")
    pinned = Origin("https", "api.test", 443, "/v1", connect_address="203.0.113.7")
    assert (pinned.host_header, pinned.target) == ("api.test", "203.0.113.7:443")


async def on_loop(loop: str, scenario: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """The scenario on this test's loop (asyncio's) or on a uvloop of its own in another thread (the proxy's)."""
    if loop == "asyncio":
        return await scenario()

    def on_uvloop() -> Any:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(scenario())

    return await asyncio.to_thread(on_uvloop)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_rollout_reaches_its_model_through_the_operators_proxy(
    backend: LocalBackend, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's HTTP_PROXY reaches the capture proxy (as OPENCODE_ENV_HTTP_PROXY): every model call goes through
    the operator's proxy; a caller's own HTTP_PROXY in the request's env changes nothing."""
    with running_test_proxy() as (proxy_url, proxy), ScriptedModelServer(demo_script()) as model:
        for name in ("NO_PROXY", "no_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        request = demo_request(model.base_url, env={"HTTP_PROXY": "http://127.0.0.1:9"})
        result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    absolute = [head for head in proxy.heads if head.startswith(b"POST http://127.0.0.1:")]
    assert len(absolute) >= 1
    assert len(model.exchanges) == len(result.proxy_turns) == 3
