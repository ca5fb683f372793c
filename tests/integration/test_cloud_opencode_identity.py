"""On a cloud VM (both fakes) OpenCode runs as a uid of its own and its tools as `user`: the real OpenCode, driven by
a scripted model that reads OpenCode's environment through OpenCode's own read tool (a real policy can), sends its
bash tool after the proxy token and OpenCode: every /proc/<pid>/environ, OpenCode's private home and config, ptrace
and signals on OpenCode's process, and calls to the proxy with the token the model saw. Each fails, the call is
counted as refused, and the rollout's record is the honest run's."""

from __future__ import annotations

import json
import re

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash, say, write
from tests.helpers import rollout
from tests.integration.test_config_race import LOOK, REPLANT, WORKDIR
from tests.integration.test_only_opencode_calls import ADD, leaking_model, read_environ, tool_outputs, trained_turns

pytestmark = pytest.mark.timeout(900)
"""One real OpenCode rollout on a fake VM per test; on a loaded machine OpenCode alone takes minutes to start.

On the E2B fake only: it runs every command in one pid namespace, as a VM does, so a tool sees OpenCode's processes
and setup's leftovers live on. The HF fake still gives each command a namespace of its own (its SDK stand-in waits
for a command's output pipes, which a child left in the background would hold); both backends run the same
CloudSandbox code, and the HF fake's layout is walked in test_cloud_trusted_root.py."""

ATTACKS = r"""python3 - '{token}' '{session}' <<'EOF'
import ctypes, glob, json, os, socket, sys
token, session = sys.argv[1:3]
print("I AM", os.getuid())
print("TOKEN SEEN", token != "no-token-seen")
found = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        found += b"OPENCODE_ENV_UPSTREAM_KEY" in open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        pass
print("ENVIRONS WITH THE KEY", found)
def status_uid(pid):
    try:
        return int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
        return -1
def name(pid):
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return "?"
theirs = [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if status_uid(p) == 1002]
print("OPENCODE PROCESSES SEEN", bool(theirs), [name(pid) for pid in theirs])
libc = ctypes.CDLL(None, use_errno=True)
for pid in theirs:
    print("PTRACE", libc.ptrace(16, pid, 0, 0), ctypes.get_errno())
    try:
        os.kill(pid, 0)
        print("SIGNAL allowed", pid, name(pid))
    except PermissionError:
        print("SIGNAL refused")
private = glob.glob("/tmp/opencode-env-agent-*/home")
for path in private:
    try:
        print("HOME LISTED", path, os.stat(path), os.listdir(path))
    except PermissionError:
        print("HOME REFUSED")
configs = glob.glob("/tmp/opencode-env*/control/opencode.json")
config = json.load(open(configs[0]))
print("KEY IN CONFIG", token in json.dumps(config))
try:
    open(configs[0], "a").write("x")
    print("CONFIG WRITTEN")
except PermissionError:
    print("CONFIG READ-ONLY")
base = next(iter(config["provider"].values()))["options"]["baseURL"]
port = int(base.split(":")[2].split("/")[0])
body = json.dumps({"model": "policy", "stream": False, "messages": [{"role": "user", "content": "FORGED call"}],
                   "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]})
head = ("POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {token}\r\nx-session-id: {session}\r\nuser-agent: opencode/1.18.33\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
for name, bind in (("plain", None), ("another loopback address", ("127.0.0.2", 0))):
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=bind) as s:
        s.sendall(head.encode() + body.encode())
        print("ATTEMPT", name, s.recv(64).split(b"\r\n")[0].decode())
EOF"""


@pytest.mark.parametrize("backend_name", ["e2b_fake"])
async def test_a_tool_cannot_reach_opencodes_token_or_call_as_opencode(
    backend_name: str, request: pytest.FixtureRequest, no_leaks: None
) -> None:
    backend: SandboxBackend = request.getfixturevalue(backend_name)
    attack = Step(tool_calls=[ToolCallStep(name="bash", arguments={"command": ATTACKS, "description": "Attack"})])
    script = Script(steps=[read_environ(), attack, write("/home/user/workdir/add.py", ADD), say("done")])
    with leaking_model(script) as (model, url):
        result = await run_rollout(demo_request(url, agent_timeout_s=600.0), backend)
    messages = json.loads(tool_outputs(model.exchanges))
    outputs = json.dumps([message for message in messages if message.get("role") == "tool"])
    assert "TOKEN SEEN True" in outputs, outputs[-3000:]
    assert "I AM 1000" in outputs
    assert "ENVIRONS WITH THE KEY 0" in outputs
    assert "OPENCODE PROCESSES SEEN True" in outputs
    assert re.findall(r"PTRACE -1 (\d+)", outputs)
    assert set(re.findall(r"PTRACE -1 (\d+)", outputs)) == {"1"}
    assert re.findall(r"SIGNAL allowed [^\\]+", outputs) == []
    assert "SIGNAL refused" in outputs
    assert "HOME REFUSED" in outputs
    assert "HOME LISTED" not in outputs, re.findall(r"HOME LISTED[^\\]*", outputs)
    assert "KEY IN CONFIG False" in outputs
    assert "CONFIG READ-ONLY" in outputs
    attempts = re.findall(r"ATTEMPT ([^\\]+)", outputs)
    assert attempts == ["plain HTTP/1.1 403 Forbidden", "another loopback address HTTP/1.1 403 Forbidden"], attempts
    assert [e for e in model.exchanges if e.request["messages"][0].get("content") == "FORGED call"] == []
    assert result.status == "completed", (result.error, result.agent_log_tail[-2000:])
    assert result.reward == 1.0
    assert [turn.kind for turn in result.proxy_turns] == ["agent"] * 4
    assert trained_turns(result) == [0, 1, 2, 3]
    assert result.attribution is not None
    assert (result.attribution.refused_calls, result.attribution.caller_check) == (2, True)
    assert result.proxy_log_tail.count("its socket is not OpenCode's") == 2


@pytest.mark.parametrize("backend_name", ["e2b_fake"])
async def test_a_leftover_of_setup_replanting_a_plugin_never_gets_it_loaded_on_a_vm(
    backend_name: str, request: pytest.FixtureRequest, no_leaks: None
) -> None:
    """As tests/integration/test_config_race.py on the local backend: setup (as `user`) leaves a loop re-planting
    `.opencode/plugin` and `opencode.json` in the work dir as fast as it can; every process of `user` is stopped
    before the removal and continued once OpenCode has made its first call, so the plugin never runs, and the loop
    is back for the agent."""
    backend: SandboxBackend = request.getfixturevalue(backend_name)
    script = Script(steps=[bash(LOOK, "look")], final_text="done")
    outcome = await rollout(
        backend, script, setup=[REPLANT], setup_as="user", verify=[], workdir=WORKDIR, agent_timeout_s=600.0
    )
    result = outcome.result
    assert result.status == "completed", (result.error, result.agent_log_tail[-2000:])
    assert all(command.exit_code == 0 for command in result.setup_results), result.setup_results
    assert "plugin-ran" not in result.files["tmp-listing.txt"], result.files["tmp-listing.txt"]
    assert len(outcome.exchanges) == len(result.proxy_turns) == 2
    assert all("from the plugin" not in str(exchange.request) for exchange in outcome.exchanges)
    removed = [warning.split(":")[0] for warning in result.warnings if "OpenCode project configuration" in warning]
    assert sorted(removed) == [f"{WORKDIR}/.opencode", f"{WORKDIR}/opencode.json"], result.warnings
    assert "x.js" in result.files["replanted.txt"].split(), "the loop was not continued for the agent"
