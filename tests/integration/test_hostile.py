"""A hostile sandbox: every test tries an attack from inside a local sandbox and asserts that it failed.

Commands run exactly as the agent's bash tool runs them (setup and verify use the same path), with the server as
root, as in CI. Canary files, canary keys and a neighbour rollout stand for what must stay out of reach.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from opencode_env.rollout.endpoints import EndpointError, resolve_upstream
from opencode_env.sandbox.base import REWARD_TXT, ResourceLimits, SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.isolation.egress import EgressPolicy, EgressProxy
from opencode_env.scripted.script import Script, bash, say
from opencode_env.settings import Settings
from opencode_env.testing.fake_e2b import host_path
from opencode_env.wire import RolloutRequest
from tests.helpers import rollout
from tests.shared_rollouts import Plan, SharedRollouts

CANARY_KEY = "sk-hostile-canary-5e1d9b"


@pytest.fixture
def root_only_canary() -> Iterator[Path]:
    """A 0600 root-owned file in a place the sandbox sees (the host's read-only /var)."""
    path = Path(f"/var/tmp-canary-{secrets.token_hex(4)}")
    path.write_text("root-only-canary")
    path.chmod(0o600)
    try:
        yield path
    finally:
        path.unlink()


async def sh(sandbox: LocalSandbox, cmd: str, **options: object) -> tuple[int | None, str]:
    result = await sandbox.run(cmd, timeout_s=30, **options)  # type: ignore[arg-type]
    return result.exit_code, result.stdout + result.stderr


async def test_commands_hold_no_capability_and_map_to_an_unprivileged_host_uid(box: LocalSandbox) -> None:
    code, out = await sh(box, "id -u; grep CapEff /proc/self/status; cat /proc/self/uid_map")
    assert code == 0
    uid, capabilities, mapping = out.splitlines()
    assert uid == "1000"
    assert capabilities.split()[1] == "0000000000000000"
    inside, outside, count = mapping.split()
    assert (inside, count) == ("1000", "1")
    assert int(outside) >= 1_000_000


async def test_root_only_files_stay_unreadable(box: LocalSandbox, root_only_canary: Path) -> None:
    code, out = await sh(box, f"cat {root_only_canary}; cat /etc/shadow")
    assert code != 0
    assert "root-only-canary" not in out
    assert "Permission denied" in out


async def test_no_mount_tricks_and_no_kernel_settings(box: LocalSandbox) -> None:
    checkout = Path(__file__).resolve().parents[2]
    _code, out = await sh(
        box,
        f"mount -o remount,rw,bind {checkout} 2>&1; mount --bind / /mnt 2>&1; "
        f"touch {checkout}/pwned 2>&1; echo 1 > /proc/sys/vm/drop_caches 2>&1; "
        "unshare -rm sh -c 'mount -o remount,rw / && touch /usr/pwned' 2>&1; echo done",
    )
    assert "done" in out
    assert not (checkout / "pwned").exists()
    assert not Path("/usr/pwned").exists()


async def test_host_only_places_and_neighbours_are_invisible(backend: LocalBackend, box: LocalSandbox) -> None:
    neighbour = await backend.create(SandboxSpec())
    try:
        await neighbour.write_file(REWARD_TXT, "0.5")
        victim = host_path(neighbour, REWARD_TXT)
        _code, out = await sh(
            box,
            f"ls /root /tmp /home; cat {victim} 2>&1; echo 0.123 > {victim} 2>&1; ls {neighbour.root} 2>&1; echo end",
        )
        assert "end" in out
        assert (await neighbour.read_file(REWARD_TXT)) == b"0.5"
        assert str(neighbour.root.name) not in out.replace(str(neighbour.root), "")
    finally:
        await neighbour.close()


async def test_planted_symlinks_never_lead_the_server_out(box: LocalSandbox, root_only_canary: Path) -> None:
    await sh(
        box,
        f"ln -sf {root_only_canary} /home/user/logs/agent/stderr.log; "
        f"ln -sf {root_only_canary} /home/user/workdir/leak.txt; "
        "ln -sfn /etc /home/user/workdir/etcdir; "
        f"mkdir -p /home/user/.rollout && ln -sf {root_only_canary} /home/user/.rollout/opencode.json",
    )
    with pytest.raises(FileNotFoundError):
        await box.read_tail("/home/user/logs/agent/stderr.log", 4096)
    with pytest.raises(FileNotFoundError):
        await box.read_file("/home/user/workdir/etcdir/passwd")
    listed = [entry.path for entry in await box.list_files("/home/user/workdir", limit=100)]
    assert listed == []
    with pytest.raises(Exception, match="refusing to write"):
        await box.write_file("/home/user/.rollout/opencode.json", "{}")
    assert root_only_canary.read_text() == "root-only-canary"


async def test_a_very_deep_tree_is_listed_bounded_and_removed(backend: LocalBackend) -> None:
    sandbox = await backend.create(SandboxSpec())
    root = sandbox.root
    code, _ = await sh(
        sandbox,
        "cd /home/user/workdir && python3 -c \"import os\nfor _ in range(3000): os.mkdir('d'); os.chdir('d')\"",
    )
    assert code == 0
    assert isinstance(await sandbox.list_files("/home/user/workdir", limit=100), list)
    await sandbox.close()
    assert not root.exists()


async def test_the_host_and_private_ranges_are_unreachable(box: LocalSandbox) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        _code, out = await sh(
            box,
            f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>&1 && echo reached-loopback; "
            "for target in 169.254.169.254:80 127.0.0.1:" + str(port) + " 10.0.0.1:80; do "
            "exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT %s HTTP/1.1\\r\\n\\r\\n' $target >&3; "
            "head -c 12 <&3; echo; exec 3<&-; done",
        )
        assert "reached-loopback" not in out
        assert out.count("HTTP/1.1 403") == 3, out
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert any("169.254.169.254:80 refused" in attempt for attempt in box.egress_attempts())


async def test_model_only_network_refuses_even_public_names(backend: LocalBackend) -> None:
    sandbox = await backend.create(SandboxSpec(network="model_only"))
    try:
        _, out = await sh(
            sandbox,
            "exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT pypi.org:443 HTTP/1.1\\r\\n\\r\\n' >&3; head -c 12 <&3",
        )
        assert out.startswith("HTTP/1.1 403")
        assert "no internet access" in " ".join(sandbox.egress_attempts()) or "cannot resolve" in " ".join(
            sandbox.egress_attempts()
        )
    finally:
        await sandbox.close()


@pytest.mark.parametrize(
    ("limits", "attack", "hit"),
    [
        (ResourceLimits(memory_mb=96), "python3 -c 'x = bytearray(400 * 2**20); print(len(x))'", "memory"),
        (ResourceLimits(max_processes=24), "for i in $(seq 60); do sleep 5 & done; wait", "processes"),
    ],
)
async def test_resource_limits_stop_the_rollout_not_the_host(
    backend: LocalBackend, limits: ResourceLimits, attack: str, hit: str
) -> None:
    sandbox = await backend.create(SandboxSpec(limits=limits))
    try:
        result = await sandbox.run(attack, timeout_s=30)
        assert result.exit_code != 0
        assert hit in sandbox.limits_hit()
        assert (await sandbox.run("echo still-alive", timeout_s=10)).stdout == "still-alive\n"
    finally:
        await sandbox.close()


async def test_the_disk_limit_bounds_the_whole_writable_tree(backend: LocalBackend) -> None:
    sandbox = await backend.create(SandboxSpec(limits=ResourceLimits(disk_mb=64)))
    try:
        result = await sandbox.run("head -c 40M /dev/zero > /home/user/a; head -c 40M /dev/zero > /tmp/b", timeout_s=30)
        assert result.exit_code != 0
        assert "No space left" in result.stderr
        assert sandbox.enforcement["disk"] == "loop ext4"
        assert "disk" in sandbox.limits_hit()
    finally:
        await sandbox.close()


async def test_setup_services_live_on_but_agent_processes_die_with_their_command(box: LocalSandbox) -> None:
    serve = "nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &"
    probe = (
        'python3 -c "import time, urllib.request\n'
        "for _ in range(50):\n"
        "    try: urllib.request.urlopen('http://127.0.0.1:{port}/'); print('up'); break\n"
        "    except OSError: time.sleep(0.1)\n"
        "else: print('down')\""
    )
    await box.run(serve.format(port=8765), timeout_s=10, keep_background=True)
    await box.run(f"{serve.format(port=8766)} (setsid {serve.format(port=8767)})", timeout_s=10)
    results = [await box.run(probe.format(port=port), timeout_s=30) for port in (8765, 8766, 8767)]
    assert [result.stdout.strip() for result in results] == ["up", "down", "down"]


def test_server_keys_go_only_to_their_own_url() -> None:
    environ = {"OPENAI_API_KEY": CANARY_KEY, "VLLM_URL": "http://vllm:8000/v1", "VLLM_API_KEY": CANARY_KEY}
    elsewhere = RolloutRequest(endpoint="openai", base_url="http://attacker.example/v1", model="m", instruction="x")
    with pytest.raises(EndpointError, match="api_key missing"):
        resolve_upstream(elsewhere, Settings.load(environ))
    keyless = RolloutRequest(endpoint="vllm", base_url="http://attacker.example/v1", model="m", instruction="x")
    assert resolve_upstream(keyless, Settings.load(environ)).api_key == ""
    same = RolloutRequest(endpoint="vllm", model="m", instruction="x")
    assert resolve_upstream(same, Settings.load(environ)).api_key == CANARY_KEY
    black_box = RolloutRequest(endpoint="vllm", model="m", instruction="x", mode="black_box")
    assert resolve_upstream(black_box, Settings.load(environ)).api_key == ""


# The hunt spells the key in two quoted halves, so the key itself never appears in the commands the agent sends.
KEY_PATTERN = '"' + CANARY_KEY[:10] + '""' + CANARY_KEY[10:] + '"'
KEY_HUNT = (
    "timeout 20 grep -rsl " + KEY_PATTERN + " /home /tmp /run /var/tmp /etc 2>/dev/null | head; "
    "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c " + KEY_PATTERN + "; "
    "ls /proc | head -50 | tr '\\n' ' '"
)


PLANT_IN_SETUP = (
    "mkdir -p /home/user/.rollout/pkg && "
    'echo \'import os; open("/tmp/stolen", "w").write(str(dict(os.environ)))\' '
    "| tee /home/user/.rollout/pkg/sitecustomize.py /home/user/workdir/json.py > /dev/null"
)
"""Code where a proxy inside the sandbox would have run it."""
FORGE_TURN = (
    'echo \'{"type": "turn", "turn": 99, "completion_tokens": ["forged"]}\' >> /home/user/logs/proxy/trace.jsonl'
)
CHEAT = (
    "mkdir -p /home/user/logs/verifier; echo '{\"reward\": 1}' > /home/user/logs/verifier/reward.json; "
    "(setsid sh -c 'while true; do echo 1 > /home/user/logs/verifier/reward.txt; sleep 0.05; done' "
    ">/dev/null 2>&1 &); echo planted"
)
"""Reward files, and a process rewriting one through verify."""
PROBE_THE_PROXY = (
    "cd / && python3 - <<'EOF'\n"
    "import json, os, urllib.request, urllib.error\n"
    "cfg = json.load(open(os.environ.get('OPENCODE_CONFIG', '/run/opencode-env/opencode.json')))\n"
    "url = next(iter(cfg['provider'].values()))['options']['baseURL'] + '/chat/completions'\n"
    "try:\n"
    "    urllib.request.urlopen(urllib.request.Request(url, data=b'{}', headers={'authorization': 'Bearer x'}))\n"
    "except urllib.error.HTTPError as error:\n"
    "    print('status', error.code)\n"
    "EOF"
)
SHARED = {
    "hunt, forge, cheat, probe": Plan(
        Script(
            steps=[
                bash(f"{KEY_HUNT}; {FORGE_TURN}; cat /tmp/stolen 2>/dev/null; {CHEAT}\n{PROBE_THE_PROXY}"),
                say("done"),
            ]
        ),
        {
            "api_key": CANARY_KEY,
            "setup": [PLANT_IN_SETUP],
            "verify": [KEY_HUNT + "; cat /tmp/stolen 2>/dev/null; sleep 0.5; false"],
            "task_id": "cheater",
        },
    ),
}
"""One rollout for the agent's attacks on the key, the trace, the reward and the proxy; they cannot mask each other,
as each acts on its own thing and shows on its own: the key hunt reads (a key found shows in the result, which
must not hold it), the forged turn is written to the trace (a turn 99 in the result), the reward files and their
rewriting process act on the verifier dir (a reward of 1.0 from reward.txt), the probe calls the proxy without the
token (its own line, `status 401`), from / so that the json.py setup planted in the work dir is not the json it
imports. Verify hunts for the key too and fails, so the grade is 0.0 unless a planted reward wins."""


@pytest.fixture(scope="module")
def shared(backend: LocalBackend, leak_check: Callable[[], None]) -> SharedRollouts:
    return SharedRollouts(backend, SHARED, leak_check)


async def test_the_key_and_the_trace_are_out_of_reach(shared: SharedRollouts) -> None:
    """Setup plants code where a proxy inside the sandbox would have run it, and the agent hunts for the key and
    writes forged turns; none of it reaches the key, and the turns in the result are the proxy's own."""
    outcome = await shared.get("hunt, forge, cheat, probe")
    result = outcome.result
    assert result.status == "completed", result.error
    assert CANARY_KEY not in result.model_dump_json()
    assert all(turn.turn != 99 for turn in result.proxy_turns)
    assert len(result.proxy_turns) == len(outcome.exchanges) == 2
    assert all(exchange.headers.get("authorization") == f"Bearer {CANARY_KEY}" for exchange in outcome.exchanges)


async def test_the_reward_comes_from_verify_alone(shared: SharedRollouts) -> None:
    """The agent plants reward files and leaves a process rewriting one during verify: verify's own verdict wins."""
    result = (await shared.get("hunt, forge, cheat, probe")).result
    assert result.status == "completed", result.error
    assert (result.reward, result.reward_source) == (0.0, "verify_pass_rate")


async def test_proxy_refuses_calls_without_the_rollouts_token(shared: SharedRollouts) -> None:
    """Anything but the rollout's own agent gets 401 from its proxy (a neighbour could not reach it anyway)."""
    outcome = await shared.get("hunt, forge, cheat, probe")
    tool_output = json.dumps(outcome.exchanges[-1].request)
    assert "status 401" in tool_output


def test_no_sandbox_runs_as_the_servers_uid() -> None:
    assert os.geteuid() == 0, "the local backend's isolation tests run as root, as CI does"


async def test_many_attacks_in_parallel_leave_the_server_responsive(backend: LocalBackend) -> None:
    boxes = await asyncio.gather(*(backend.create(SandboxSpec(limits=ResourceLimits(memory_mb=96))) for _ in range(3)))
    try:
        results = await asyncio.gather(*(box.run("python3 -c 'bytearray(300 * 2**20)'", timeout_s=30) for box in boxes))
        assert all(result.exit_code != 0 for result in results)
    finally:
        await asyncio.gather(*(box.close() for box in boxes))


async def test_the_egress_policy_refuses_private_names_unless_the_operator_trusts_them() -> None:
    plain = EgressProxy(EgressPolicy(internet=True), rollout="unit")
    trusted = EgressProxy(EgressPolicy(internet=True, trusted_hosts=frozenset({"localhost"})), rollout="unit")
    offline = EgressProxy(
        EgressPolicy(internet=False, trusted_hosts=frozenset({"localhost"}), allowed=frozenset({("model", 8000)})),
        rollout="unit",
    )
    assert (await plain._vet("localhost", 443))[0] is None
    assert (await trusted._vet("localhost", 443))[0] == "127.0.0.1"
    assert (await offline._vet("localhost", 443))[0] is None
    assert [attempt.allowed for attempt in plain.attempts + trusted.attempts + offline.attempts] == [False, True, False]


@pytest.mark.parametrize(
    ("limits", "attack", "hit"),
    [
        ({"max_processes": 32}, "for i in $(seq 200); do sleep 30 & done; wait", "processes"),
        ({"memory_mb": 128}, "python3 -c 'x = bytearray(600 * 2**20); print(len(x))'", "memory"),
    ],
)
async def test_a_limit_the_kernel_enforced_in_setup_is_reported(
    backend: LocalBackend, no_leaks: None, limits: dict[str, int], attack: str, hit: str
) -> None:
    outcome = await rollout(backend, Script(steps=[say("never asked")]), setup=[attack], **limits)
    assert outcome.result.status == "setup_failed", outcome.result.error
    assert hit in outcome.result.limits_hit
