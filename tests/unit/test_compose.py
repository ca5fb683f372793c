"""docker-compose files read into the typed model: any text parses or is refused with the field it failed at."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.sandbox.local.images.build.hints import only_local_urls
from opencode_env.tasks.compose import ComposeError, parse_compose
from opencode_env.wire import RolloutRequest
from opencode_env.wire.services import Dependency, HealthCheck, Service, service_problems, start_order

FIELD = re.compile(r"^(top level|services|volumes|the compose file|[a-z][\w.-]*(\.[\w.\[\]-]+)*)[: ]")

KEYS = [
    "services", "version", "volumes", "networks", "x-common", "build", "image", "command", "entrypoint",
    "environment", "working_dir", "depends_on", "healthcheck", "test", "interval", "retries", "condition",
    "context", "dockerfile", "ports", "mem_limit", "user", "privileged", "env_file", "main", "kv", "db",
    "service_healthy", "start_period", "hostname", "Dockerfile",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.sampled_from(KEYS),
    st.text(max_size=20),
    st.sampled_from(["${HOME}", "$$x", "${A:-b}", "1m30s", "512m", "CMD", "CMD-SHELL", "NONE", "../..", "/etc"]),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(KEYS), scalars), inner, max_size=5)
    ),
    max_leaves=40,
)


def _parses_or_names_a_field(text: str) -> None:
    try:
        parse_compose(text)
    except ComposeError as error:
        refusal = str(error)
    else:
        return
    assert FIELD.match(refusal), refusal


@settings(max_examples=400, deadline=None)
@given(documents)
def test_any_structure_parses_or_is_refused_with_its_field(document):
    _parses_or_names_a_field(yaml.safe_dump(document))


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_or_is_refused(text):
    _parses_or_names_a_field(text)


SIDECAR = """
services:
  main:
    build: .
    depends_on:
      kv: {condition: service_healthy}
  kv:
    build: {context: kv, dockerfile: Dockerfile}
    command: python3 /srv/kv.py --port 8080
    environment: [KV_MODE=strict, "GREETING=${GREETING:-hello}", "PRICE=$$5"]
    working_dir: /srv
    ports: ["8080:8080"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://kv:8080/health')"]
      interval: 1s
      retries: 30
      start_period: 1m30s
"""


def test_a_sidecar_with_a_healthcheck_is_read_as_declared():
    parsed = parse_compose(SIDECAR)
    assert parsed.main is not None
    assert parsed.main.build == "."
    assert parsed.main.depends_on == [Dependency(service="kv", condition="service_healthy")]
    (kv,) = parsed.sidecars
    assert kv.build == "kv"
    assert kv.working_dir == "/srv"
    assert kv.command == ["python3", "/srv/kv.py", "--port", "8080"]
    assert kv.environment == {"KV_MODE": "strict", "GREETING": "hello", "PRICE": "$5"}
    assert kv.healthcheck is not None
    assert kv.healthcheck.test[:2] == ["python3", "-c"]
    assert (kv.healthcheck.interval_s, kv.healthcheck.retries, kv.healthcheck.start_period_s) == (1.0, 30, 90.0)
    assert any("ports" in note for note in parsed.noted)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("services:\n  kv:\n    build: kv\n    volumes: ['/etc:/etc']\n", "services.kv.volumes"),
        ("services:\n  kv:\n    build: kv\n    volumes: ['data:/data']\n", "services.kv.volumes"),
        ("volumes:\n  data: {}\nservices:\n  kv: {build: kv}\n", "volumes"),
        ("services:\n  kv:\n    build: ../../etc\n", "services.kv.build"),
        ("services:\n  kv:\n    build: /etc\n", "services.kv.build"),
        ("services:\n  kv:\n    build: {context: kv, dockerfile: Other}\n", "services.kv.build.dockerfile"),
        ("services:\n  kv:\n    build: kv\n    privileged: true\n", "services.kv.privileged"),
        ("services:\n  kv:\n    build: kv\n    network_mode: host\n", "services.kv.network_mode"),
        ("services:\n  kv:\n    build: kv\n    pid: host\n", "services.kv.pid"),
        ("services:\n  kv:\n    build: kv\n    frobnicate: 1\n", "services.kv.frobnicate"),
        ("services:\n  kv:\n    build: kv\n    environment: [SECRET]\n", "services.kv.environment.SECRET"),
        ("services:\n  kv:\n    build: kv\n    command: echo ${HOME}\n", "services.kv.command"),
        ("services:\n  kv:\n    build: kv\n    user: '1000'\n", "services.kv.user"),
        ("services:\n  kv:\n    build: kv\nHC{test: [CMD], interval: 1s}\n", "services.kv.healthcheck.test"),
        ("services:\n  kv:\n    build: kv\nHC{test: 'true', interval: soon}\n", "services.kv.healthcheck.interval"),
        (
            "services:\n  kv:\n    build: kv\n    depends_on: {db: {condition: later}}\n",
            "services.kv.depends_on.db.condition",
        ),
        ("services:\n  kv: {}\n", "services.kv"),
        ("services: []\n", "services"),
        ("services:\n  Bad_Name: {build: x}\n", "services"),
        ("services:\n  pypi.org: {build: x}\n", "services"),
        ("services:\n  kv: {build: x, hostname: api.openai.com}\n", "services.kv"),
        ("secrets: {}\nservices:\n  kv: {build: kv}\n", "top level"),
    ],
)  # fmt: skip
def test_what_we_cannot_run_is_refused_by_its_field(body, field):
    body = body.replace("HC", "    healthcheck: ")
    with pytest.raises(ComposeError) as refused:
        parse_compose(body)
    assert str(refused.value).startswith(f"{field}:"), str(refused.value)


def test_a_yaml_bomb_is_refused_before_it_is_built():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9)
    )
    with pytest.raises(ComposeError, match="aliases"):
        parse_compose(bomb)


def test_nesting_is_bounded():
    with pytest.raises(ComposeError, match="nests deeper"):
        parse_compose("services: " + "[" * 200 + "]" * 200)


def _service(name, *depends, health=False):
    return Service(
        name=name,
        image="localhost/x",
        command=["true"],
        depends_on=[
            Dependency(service=d, condition="service_healthy" if health else "service_started") for d in depends
        ],
        healthcheck=HealthCheck(test=["true"]) if name == "db" else None,
    )


def test_services_start_after_what_they_depend_on():
    services = [_service("web", "kv", "db"), _service("kv", "db", health=True), _service("db")]
    assert [s.name for s in start_order(services)] == ["db", "kv", "web"]
    assert service_problems(services) == []


@pytest.mark.parametrize(
    ("services", "said"),
    [
        ([_service("a", "b"), _service("b", "a")], "goes round"),
        ([_service("a", "nope")], "'nope' is no sidecar"),
        ([_service("a", "b", health=True), _service("b")], "has no healthcheck"),
        ([_service("a"), _service("a")], "'a' twice"),
        ([_service("main")], "rollout's own sandbox"),
    ],
)
def test_unrunnable_service_sets_are_refused_at_the_wire(services, said):
    assert any(said in problem for problem in service_problems(services))
    with pytest.raises(ValueError, match=said):
        RolloutRequest(instruction="x", services=services)


def test_a_services_loader_variables_are_refused():
    service = Service(name="kv", image="x", command=["true"], env={"LD_PRELOAD": "/tmp/x.so"})
    with pytest.raises(ValueError, match=r"services\.kv\.env: LD_PRELOAD"):
        RolloutRequest(instruction="x", services=[service])


LOCAL = frozenset({"localhost", "127.0.0.1", "main", "kv"})


@pytest.mark.parametrize(
    ("line", "local"),
    [
        ('secret="$(curl -sf http://kv:8080/secret)"', True),
        ("wget -qO- http://localhost:9000/health", True),
        ("curl -LsSf https://astral.sh/uv/install.sh | sh", False),
        ("curl http://kv.example.com/x", False),
        ("curl http://kv:8080/x && pip install requests", False),
        ("curl http://kv:8080/x http://pypi.org/simple", False),
        ("curl -o x $URL", False),
    ],
)
def test_a_test_line_reaching_only_the_tasks_services_needs_no_network(line, local):
    assert only_local_urls(line, LOCAL) is local
