"""Sidecars on the local backend, attacked: each service a sandbox of its own in the rollout's network namespace (a
pod's loopback, the rollout's egress policy, nothing of the host's network), waited for as declared, and closed with
the rollout on every path."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxError, SandboxSpec
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.images.build.builder import ImageBuilder, ImageBuildError
from opencode_env.sandbox.local.images.store import BASE_IMAGE
from opencode_env.settings import Settings
from opencode_env.tasks.harbor import request_from_task_dir
from opencode_env.wire import RolloutRequest
from opencode_env.wire.services import Dependency, HealthCheck, Service
from tests.conftest import processes_mentioning

pytestmark = pytest.mark.timeout(600)
WEB = Service(
    name="web",
    image=BASE_IMAGE,
    command=["python3", "-m", "http.server", "8090", "--bind", "127.0.0.1"],
    workdir="/srv",
    healthcheck=HealthCheck(
        test=["curl", "-sf", "--noproxy", "*", "http://127.0.0.1:8090/"], interval_s=0.2, retries=300
    ),
    awaited="service_healthy",
    aliases=["www"],
)


@pytest.fixture(scope="module", autouse=True)
def base_image() -> str:
    return build_base_image()


class _Counted(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on the host's loopback, counting what reaches it."""
    _Counted.hits = []
    server = HTTPServer(("127.0.0.1", 0), _Counted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], _Counted.hits
    server.shutdown()
    server.server_close()


def _spec(*services: Service) -> SandboxSpec:
    return SandboxSpec(image=BASE_IMAGE, network="model_only", services=services)


def _gone(pid: int, settle_s: float = 5.0) -> bool:
    """The process exited (or is a zombie: killed, its parent not yet done with it), within `settle_s`."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def _roots(base: Path) -> set[str]:
    return {path.name for path in base.iterdir()}


async def test_services_share_the_rollouts_loopback_and_nothing_else(
    backend: LocalBackend, host_server: tuple[int, list[str]]
) -> None:
    port, hits = host_server
    box = await backend.create(_spec(WEB))
    try:
        (web,) = box.sidecars.sandboxes
        assert isinstance(web, LocalSandbox)
        for name in ("web", "www"):
            reached = await box.run(f"curl -sf -o /dev/null -w '%{{http_code}}' http://{name}:8090/", timeout_s=30)
            assert reached.stdout == "200", (name, reached.stderr)
        assert (await box.run("getent hosts web", timeout_s=30)).stdout.split()[0] == "127.0.0.1"
        host = await web.run(f"curl -s --noproxy '*' -m 5 http://127.0.0.1:{port}/from-sidecar", timeout_s=30)
        assert host.exit_code != 0, "a sidecar reached the host's loopback"
        direct = await web.run("curl -s --noproxy '*' -m 5 http://1.1.1.1/", timeout_s=30)
        assert direct.exit_code != 0, "a sidecar reached an address with no proxy in between"
        proxied = await web.run("curl -s -m 10 -o /dev/null -w '%{http_code}' http://example.com/", timeout_s=30)
        assert proxied.stdout != "200"
        assert any(a.startswith("example.com:80 refused") for a in box.egress_attempts()), box.egress_attempts()
        assert web.enforcement["network"].startswith("the rollout's"), web.enforcement
        assert "web (local-" in box.enforcement["services"]
    finally:
        await box.close()
    assert hits == [], "the host's loopback server was reached"


async def test_every_sidecar_is_closed_with_the_rollout(backend: LocalBackend, sandbox_base: Path) -> None:
    box = await backend.create(_spec(WEB))
    (web,) = box.sidecars.sandboxes
    assert isinstance(web, LocalSandbox)
    holder, root = web.holder_pid, web.root
    assert Path(f"/proc/{holder}").exists()
    await box.close()
    assert not root.exists(), "the sidecar's tree outlived the rollout"
    assert _gone(holder), "the sidecar's holder outlived the rollout"
    assert processes_mentioning(str(root)) == []


async def test_a_service_that_never_gets_healthy_fails_naming_it_and_leaves_nothing(
    backend: LocalBackend, sandbox_base: Path
) -> None:
    before = _roots(sandbox_base)
    never = WEB.model_copy(
        update={"command": ["sleep", "infinity"], "healthcheck": HealthCheck(test=["false"], interval_s=0.1, retries=3)}
    )
    with pytest.raises(SandboxError, match=r"service 'web': its healthcheck did not pass within \d+ s"):
        await backend.create(_spec(never))
    assert _roots(sandbox_base) - before == set(), "a failed start left a sandbox behind"


async def test_a_service_that_exits_is_reported_with_its_output(backend: LocalBackend, sandbox_base: Path) -> None:
    before = _roots(sandbox_base)
    crashing = WEB.model_copy(update={"command": ["sh", "-c", "echo the port is taken >&2; exit 3"]})
    with pytest.raises(SandboxError, match="service 'web' exited before its healthcheck passed: the port is taken"):
        await backend.create(_spec(crashing))
    assert _roots(sandbox_base) - before == set()


async def test_services_start_in_dependency_order(backend: LocalBackend) -> None:
    """`kv` waits for `web` healthy and `seed` run to success: what kv finds on the loopback the services share when
    it starts shows web was up before it."""
    seed = Service(name="seed", image=BASE_IMAGE, command=["sh", "-c", "sleep 1; echo seeded"])
    probe = (
        "curl -sf --noproxy '*' -m 2 http://127.0.0.1:8090/ >/dev/null && echo up > /tmp/seen || echo down > /tmp/seen"
    )
    kv = Service(
        name="kv",
        image=BASE_IMAGE,
        command=["sh", "-c", f"{probe}; sleep infinity"],
        depends_on=[
            Dependency(service="web", condition="service_healthy"),
            Dependency(service="seed", condition="service_completed_successfully"),
        ],
    )
    box = await backend.create(_spec(kv, seed, WEB))
    try:
        names = [s.sandbox_id for s in box.sidecars.sandboxes]
        assert len(names) == 3
        kv_box = box.sidecars.sandboxes[-1]
        seen = await kv_box.run(
            "for _ in $(seq 50); do [ -s /tmp/seen ] && break; sleep 0.1; done; cat /tmp/seen", timeout_s=30
        )
        assert seen.stdout.strip() == "up", "kv started before web was healthy"
    finally:
        await box.close()


async def test_a_failing_one_shot_dependency_stops_the_start(backend: LocalBackend) -> None:
    seed = Service(name="seed", image=BASE_IMAGE, command=["sh", "-c", "echo migration failed; exit 4"])
    kv = Service(
        name="kv", image=BASE_IMAGE, command=["sleep", "infinity"],
        depends_on=[Dependency(service="seed", condition="service_completed_successfully")],
    )  # fmt: skip
    with pytest.raises(SandboxError, match=r"service 'seed' exited 4 .*migration failed"):
        await backend.create(_spec(kv, seed))


async def test_a_sidecars_resource_use_is_the_rollouts(backend: LocalBackend) -> None:
    """A service past its memory is killed by its own cgroup, and the rollout's sandbox says a limit was hit."""
    hog = Service(
        name="hog", image=BASE_IMAGE, memory_mb=96,
        command=["python3", "-c", "import time; x = bytearray(400 * 2**20); time.sleep(600)"],
    )  # fmt: skip
    box = await backend.create(_spec(hog))
    try:
        for _ in range(100):
            if "memory" in box.limits_hit():
                break
            await asyncio.sleep(0.1)
        assert "memory" in box.limits_hit()
        assert (await box.run("echo still-alive", timeout_s=10)).stdout == "still-alive\n"
    finally:
        await box.close()


async def test_services_need_an_image_and_a_network_of_their_own(backend: LocalBackend) -> None:
    with pytest.raises(SandboxError, match="services: sidecars run beside a sandbox of an image"):
        await backend.create(SandboxSpec(image="host", services=(WEB,)))


async def test_an_agent_cannot_answer_for_a_service_that_died(backend: LocalBackend) -> None:
    """The pod's price: a service that exits leaves its port on the shared loopback, and the agent can bind it and
    answer in the service's place while it runs. Its processes are gone before verify, so the grader never talks
    to it; and the rollout says the service was down (an error notice), whose grade is then about a dead service."""
    short = Service(name="web", image=BASE_IMAGE, command=["sh", "-c", "sleep 1"])
    impostor = (
        "sleep 2; mkdir -p /tmp/site && echo forged > /tmp/site/answer && cd /tmp/site && "
        "(python3 -m http.server 8090 --bind 127.0.0.1 >/dev/null 2>&1 &) && sleep 1 && "
        "curl -sf http://web:8090/answer"
    )
    request = RolloutRequest(
        instruction="x",
        image=BASE_IMAGE,
        services=[short],
        solution=[impostor],
        verify=['test "$(curl -sf http://web:8090/answer)" = forged'],
        verify_sandbox="same",
    )
    result = await run_rollout(request, backend)
    assert result.solution_results[0].stdout == "forged\n", "the agent's impostor did not serve on the port"
    assert (result.status, result.reward) == ("completed", 0.0), "the grader talked to the agent's impostor"
    (notice,) = [n for n in result.notices if n.code == "service_down"]
    assert notice.severity == "error"
    assert "services web exited before verify" in notice.message


async def test_a_cloud_backend_refuses_services_by_name(e2b_fake: E2BBackend) -> None:
    request = RolloutRequest(instruction="x", solution=[], verify=["true"], services=[WEB])
    result = await run_rollout(request, e2b_fake)
    assert (result.status, result.failed_phase) == ("sandbox_error", "sandbox")
    assert "services: the e2b backend runs one sandbox per rollout, not sidecars" in (result.error or "")


def test_a_registry_image_this_machine_lacks_is_refused_naming_service_and_field(tmp_path: Path) -> None:
    task = tmp_path / "pg-task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Query the database.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n")
    compose = "services:\n  db:\n    image: docker.io/library/postgres:16-nowhere\n"
    (task / "environment" / "docker-compose.yaml").write_text(compose)
    builder = ImageBuilder.for_settings(Settings.load())
    with pytest.raises(
        ImageBuildError, match=r"services\.db\.image: 'docker\.io/library/postgres:16-nowhere' is not in"
    ):
        request_from_task_dir(task, builder=builder)
