"""A caller's base URL is not a network primitive: what a server lets its callers point the proxy at."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import replace

import pytest
from fastmcp import Client

from opencode_env.rollout.endpoints import resolve_upstream
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.upstream_policy import LOOPBACK, AllowList, UpstreamPolicy, UpstreamRefused
from opencode_env.sandbox.addresses import ALWAYS_LOCAL, IPAddress, IPNetwork
from opencode_env.server.served_ports import ServedPorts
from opencode_env.settings import Settings, variable
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest
from opencode_env.wire.answer import inline_result
from tests.server_app import runtime_for
from tests.stub_server import stub_arguments, stub_server

NAMES = {
    "api.example.com": ["93.184.216.34"],
    "vllm.internal": ["10.0.0.7"],
    "sneaky.example.com": ["93.184.216.34", "169.254.169.254"],
    "nat64.example.com": ["64:ff9b::a9fe:a9fe"],
}
THIS_MACHINE: frozenset[IPNetwork] = ALWAYS_LOCAL | {ipaddress.ip_network("198.51.100.20/32")}


def resolve(host: str, port: int) -> Sequence[IPAddress]:
    if host not in NAMES:
        raise socket.gaierror(f"unknown name {host}")
    return [ipaddress.ip_address(address) for address in NAMES[host]]


def policy(allow: str = "", *, own_ports: frozenset[int] = frozenset({8000}), local: bool = False) -> UpstreamPolicy:
    base = UpstreamPolicy.configured(allow, lambda: own_ports, callers_are_local=local)
    return UpstreamPolicy(base.allowed, base.own_ports, resolve, lambda: THIS_MACHINE)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9999/v1", "this machine"),
        ("http://localhost:9999/v1", "cannot resolve"),
        ("http://vllm.internal:8000/v1", "10.0.0.7"),
        ("http://sneaky.example.com/v1", "169.254.169.254"),
        ("http://nat64.example.com/v1", "embeds 169.254.169.254"),
        ("http://198.51.100.20:8080/v1", "this machine"),
        ("http://[::ffff:127.0.0.1]:9999/v1", "this machine"),
    ],
)
def test_a_caller_may_not_point_the_proxy_inward(url: str, reason: str) -> None:
    with pytest.raises(UpstreamRefused, match=reason) as refused:
        policy().check(url)
    assert variable("upstream_allow") in str(refused.value) or "cannot resolve" in str(refused.value)


def test_public_endpoints_and_what_the_operator_allows_pass_pinned_to_the_address_checked() -> None:
    assert policy().check("https://api.example.com/v1") == "93.184.216.34"
    assert policy("vllm.internal").check("http://vllm.internal:8000/v1") == "10.0.0.7"
    policy("vllm.internal").check("http://vllm.internal:8000/v1")
    policy("10.0.0.0/8").check("http://vllm.internal:8000/v1")
    policy("vllm.internal:8000").check("http://vllm.internal:8000/v1")
    with pytest.raises(UpstreamRefused):
        policy("vllm.internal:8000").check("http://vllm.internal:9000/v1")


def test_a_server_for_local_callers_allows_loopback_but_never_its_own_port() -> None:
    policy(local=True).check("http://127.0.0.1:9999/v1")
    with pytest.raises(UpstreamRefused, match="this server itself"):
        policy(local=True).check("http://127.0.0.1:8000/v1")
    with pytest.raises(UpstreamRefused, match="this server itself"):
        policy("127.0.0.0/8").check("http://127.0.0.1:8000/v1")
    with pytest.raises(UpstreamRefused):
        policy(local=True).check("http://vllm.internal:8000/v1")


def test_the_allow_list_reads_hosts_ports_and_networks() -> None:
    allowed = AllowList.parse(" VLLM.internal, gpu-box:8000, 10.1.0.0/16 ,[::1]:9000,")
    assert allowed.hosts == {"vllm.internal"}
    assert allowed.host_ports == {("gpu-box", 8000), ("::1", 9000)}
    assert allowed.networks == {ipaddress.ip_network("10.1.0.0/16")}


def test_only_a_url_the_caller_chose_is_checked() -> None:
    environ = {"VLLM_URL": "http://127.0.0.1:8000/v1", "VLLM_MODEL": "m"}
    configured = RolloutRequest(endpoint="vllm", instruction="x")
    chosen = RolloutRequest(endpoint="vllm", base_url="http://127.0.0.1:9/v1", model="m", instruction="x")
    assert not resolve_upstream(configured, Settings.load(environ)).from_caller
    assert resolve_upstream(chosen, Settings.load(environ)).from_caller


async def test_a_refused_url_ends_the_rollout_as_an_invalid_request_before_any_sandbox() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    try:
        backend = StubBackend()
        request = RolloutRequest(base_url=f"http://127.0.0.1:{port}/v1", model="m", instruction="x")
        strict = UpstreamPolicy.configured("", lambda: frozenset({8000}))
        result = await run_rollout(request, backend, upstream_policy=strict)
        assert (result.status, result.failed_phase) == ("invalid_request", "validate")
        assert "base_url" in (result.error or "")
        assert variable("upstream_allow") in (result.error or "")
        assert result.sandbox_id == ""
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_the_server_builds_its_policy_from_its_access_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(variable("upstream_allow"), raising=False)

    def allowed(token: str) -> AllowList:
        policy = runtime_for(StubBackend(), token=token).rollouts.upstream_policy
        assert policy is not None
        return policy.allowed

    assert allowed("a-token") == AllowList()
    assert allowed("") == LOOPBACK
    monkeypatch.setenv(variable("upstream_allow"), "gpu-box:8000")
    assert allowed("").host_ports == {("gpu-box", 8000)}


SERVER_KEY = "sk-operator-key-7f3a"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"setup": ["apt-get install -y foo"]}, "setup_as='root' with setup commands"),
        ({"image": "python:3.12"}, "image"),
        ({"template": "their-template"}, "template"),
    ],
)
async def test_the_servers_key_never_meets_a_callers_root_in_a_shared_vm(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, object], named: str
) -> None:
    """On a backend whose proxy shares the VM with the task's root (E2B, HF; here the stub declaring so), a caller
    relying on the server's key may not run root code or name the image; with its own key it may."""
    monkeypatch.setenv("OPENAI_API_KEY", SERVER_KEY)
    backend = StubBackend(capabilities=replace(StubBackend.capabilities, proxy_beside_task_root=True))
    request = RolloutRequest(endpoint="openai", model="gpt-x", instruction="x", **fields)  # type: ignore[arg-type]
    result = await run_rollout(request, backend, upstream_policy=policy())
    assert (result.status, result.failed_phase, result.sandbox_id) == ("invalid_request", "validate", "")
    assert (result.error or "").startswith(named)
    assert "send your own api_key" in (result.error or "")
    assert SERVER_KEY not in result.model_dump_json()
    own = await run_rollout(request.model_copy(update={"api_key": "sk-callers-own"}), backend, upstream_policy=policy())
    assert own.status != "invalid_request", own.error
    user_setup = request.model_copy(update={"setup_as": "user", "image": "", "template": ""})
    as_user = await run_rollout(user_setup, backend, upstream_policy=policy())
    assert as_user.status != "invalid_request", as_user.error
    in_process = await run_rollout(request, backend)
    assert in_process.status != "invalid_request", in_process.error


async def test_a_caller_cannot_point_a_rollout_at_the_server_it_calls_whatever_port_it_listens_on() -> None:
    """The issue's attack: a server started on a port other than PORT (here one the OS picked), no token, so
    loopback is allowed; a caller names the server itself as its model."""
    with stub_server(command_s=0.0) as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert port != Settings.load().port
        arguments = {**stub_arguments("inward"), "base_url": f"http://127.0.0.1:{port}/v1", "mode": "transparent_proxy"}
        async with Client(f"{server.url}/mcp") as client:
            answer = await client.call_tool("run_rollout", arguments)
        result = inline_result(answer.structured_content)
        assert result.status == "invalid_request"
        assert "this server itself" in (result.error or "")
        assert server.backend.created == 0


def test_the_ports_the_server_is_reached_on_are_its_own() -> None:
    ports = ServedPorts(configured=8000)
    ports.note({"type": "http", "server": ("127.0.0.1", 41234)})
    ports.note({"type": "websocket", "server": ("::1", 41235, 0, 0)})
    ports.note({"type": "http", "server": None})
    assert ports() == {8000, 41234, 41235}
