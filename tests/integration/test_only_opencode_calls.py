"""Only OpenCode calls the model, and attribution rests on nothing the agent can write: the real OpenCode, driven by
a scripted model, attacks the caller check and OpenCode's session store through its own tools, and every attack
ends with the honest run's status, reward and trained turns.

The model here is the scripted one with one power a real policy has: it reads what OpenCode's tools showed it and
puts it into its next tool call (the proxy token OpenCode's read tool shows from `/proc/self/environ`, and the
session id OpenCode sends in its own calls' headers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModel
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash, say, task, write
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.training.sequences import training_sequences
from opencode_env.wire import RolloutResult

pytestmark = pytest.mark.timeout(480)
"""Each test is a real OpenCode rollout of several steps, some with a sub-agent, whose agent deadline is generous:
on a machine other tests load, OpenCode can take minutes to boot a sub-agent."""
ADD = "def add(a, b):\n    return a + b\n"
LEAKED_KEY = re.compile(r"OPENCODE_ENV_UPSTREAM_KEY=([A-Za-z0-9_-]+)")


class LeakingModel(ScriptedModel):
    """Fills `{token}` and `{session}` in a step's tool arguments with the proxy token a tool result showed and the
    session id of the call being answered."""

    def _next_step(self, session: str, request: dict[str, Any]) -> Step:
        step = super()._next_step(session, request)
        found = LEAKED_KEY.search(json.dumps(request.get("messages", [])))
        token = found.group(1) if found else "no-token-seen"
        calls = [
            ToolCallStep(
                name=call.name,
                arguments=json.loads(
                    json.dumps(call.arguments).replace("{token}", token).replace("{session}", session)
                ),
            )
            for call in step.tool_calls
        ]
        return step.model_copy(update={"tool_calls": calls})


@contextmanager
def leaking_model(script: Script, **model_args: Any) -> Iterator[tuple[LeakingModel, str]]:
    model = LeakingModel(script, **model_args)
    server = ThreadedServer(model.app, host="127.0.0.1", port=0, lifespan="off")
    server.start()
    try:
        yield model, f"{server.url}/v1"
    finally:
        server.stop()


def read_environ() -> Step:
    return Step(tool_calls=[ToolCallStep(name="read", arguments={"filePath": "/proc/self/environ"})])


CALLER_ATTACKS = r"""python3 - '{token}' '{session}' <<'EOF'
import json, os, socket, sys, time
token, session = sys.argv[1], sys.argv[2]
config = json.load(open(os.environ.get("OPENCODE_CONFIG", "/run/opencode-env/opencode.json")))
base = next(iter(config["provider"].values()))["options"]["baseURL"]
port = int(base.split(":")[2].split("/")[0])
body = json.dumps({"model": "policy", "stream": False, "messages": [{"role": "user", "content": "FORGED call"}],
                   "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]})
head = ("POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {token}\r\nx-session-id: {session}\r\nuser-agent: opencode/1.18.33\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
def opencode_ports():
    # OpenCode's open connections to the proxy, as this sandbox's TCP table shows them to anyone
    rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
    return [int(r[1].split(":")[1], 16) for r in rows if int(r[2].split(":")[1], 16) == port and r[3] == "01"]
def call(name, bind=None, family=socket.AF_INET, target="127.0.0.1"):
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if bind:
                s.bind(bind)
            s.settimeout(20)
            s.connect((target, port))
            s.sendall(head.encode() + body.encode())
            print("ATTEMPT", name, s.recv(64).split(b"\r\n")[0].decode())
    except OSError as error:
        print("ATTEMPT", name, "socket error", error.errno)
print("TOKEN SEEN", token != "no-token-seen")
call("plain")
call("another loopback address", bind=("127.0.0.2", 0))
# a sub-agent calls the model meanwhile (the task tool, in the same step): wait for its open connection
deadline = time.monotonic() + 150
while not opencode_ports() and time.monotonic() < deadline:
    time.sleep(0.05)
print("OPENCODE CONNECTED", bool(opencode_ports()))
for client in opencode_ports():
    call("127.0.0.2 with opencode's client port", bind=("127.0.0.2", client))
    call("127.0.0.1 with opencode's client port", bind=("127.0.0.1", client))
call("ipv4-mapped ipv6", family=socket.AF_INET6, target="::ffff:127.0.0.1")
EOF"""


def tool_outputs(exchanges: list[Any]) -> str:
    """What the tools printed, as the root session's last call carried it back (each once)."""
    return json.dumps(exchanges[-1].request.get("messages", []))


def trained_turns(result: RolloutResult) -> list[int]:
    return sorted(turn for sequence in training_sequences(result).sequences for turn in sequence.turns)


async def test_a_tool_with_opencodes_token_and_session_cannot_call_from_any_socket(
    backend: LocalBackend, no_leaks: None
) -> None:
    """The token through OpenCode's own read tool, OpenCode's session id in the header: plain, from another loopback
    address, from another address with the client port of OpenCode's open connection (the ports-only match of an
    earlier round took it), from the same address and port (the kernel refuses the twin), over IPv6. OpenCode's
    connection is held open by a sub-agent's slow call in the same step."""
    attack_and_sub_agent = Step(
        tool_calls=[
            ToolCallStep(name="bash", arguments={"command": CALLER_ATTACKS, "description": "Call the model"}),
            ToolCallStep(
                name="task",
                arguments={"description": "Wait", "prompt": "Say hello.", "subagent_type": "general"},
            ),
        ]
    )
    script = Script(steps=[read_environ(), attack_and_sub_agent, write("/home/user/workdir/add.py", ADD), say("done")])
    sub_script = Script(steps=[Step(content="hello", stall_before_s=8.0)])
    with leaking_model(script, sub_script=sub_script) as (model, url):
        result = await run_rollout(demo_request(url, sub_agents=True, agent_timeout_s=240.0), backend)
    outputs = tool_outputs(model.exchanges)
    assert "TOKEN SEEN True" in outputs
    assert "OPENCODE CONNECTED True" in outputs
    attempts = re.findall(r"ATTEMPT ([^\\]+)", outputs)
    assert "plain HTTP/1.1 403 Forbidden" in attempts
    assert "another loopback address HTTP/1.1 403 Forbidden" in attempts
    assert "127.0.0.2 with opencode's client port HTTP/1.1 403 Forbidden" in attempts
    twin = "127.0.0.1 with opencode's client port socket error"
    assert {f"{twin} 98", f"{twin} 99"} & set(attempts), attempts
    assert "ipv4-mapped ipv6 HTTP/1.1 403 Forbidden" in attempts
    refused = sum("403" in attempt for attempt in attempts)
    assert [e for e in model.exchanges if e.request["messages"][0]["content"] == "FORGED call"] == []
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert len(result.proxy_turns) == len(model.exchanges) == result.usage.llm_calls == 5
    kinds = [turn.kind for turn in result.proxy_turns]
    assert sorted(kinds) == ["agent", "agent", "agent", "agent", "sub_agent"], kinds
    assert trained_turns(result) == [0, 1, 2, 3, 4]
    assert result.attribution is not None
    assert (result.attribution.refused_calls, result.attribution.caller_check) == (refused, True)
    assert f"{refused} model calls were refused by the capture proxy" in " ".join(result.warnings)
    assert result.proxy_log_tail.count("its socket is not OpenCode's") == refused


async def test_a_store_written_through_a_link_costs_only_the_labels(backend: LocalBackend, no_leaks: None) -> None:
    """OpenCode's file tools are denied its data dir by path, but the bash tool links it into the work dir and the
    write tool writes through the link, as OpenCode: here garbage over the store's write-ahead log once a sub-agent
    has run. The record stands: the honest status and reward, every turn of the root and the sub-agent trained,
    and a warning names the store."""
    script = Script(
        steps=[
            write("/home/user/workdir/add.py", ADD),
            task("Count the files in the work dir."),
            bash("ln -s /home/opencode/data/opencode /home/user/workdir/d"),
            write("/home/user/workdir/d/opencode.db-wal", "garbage " * 100),
            say("done"),
        ]
    )
    sub_script = Script(steps=[bash("ls /home/user/workdir | wc -l", "Count files"), say("There is 1 file.")])
    with leaking_model(script, sub_script=sub_script) as (model, url):
        result = await run_rollout(demo_request(url, sub_agents=True), backend)
    assert "Wrote file successfully" in tool_outputs(model.exchanges)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    kinds = [turn.kind for turn in result.proxy_turns]
    assert sorted(kinds) == ["agent"] * 5 + ["sub_agent"] * 2, kinds
    assert len({turn.session_id for turn in result.proxy_turns}) == 2
    assert trained_turns(result) == [turn.turn for turn in result.proxy_turns]
    assert result.usage.llm_calls == len(model.exchanges) == 7
    store_warnings = [warning for warning in result.warnings if "OpenCode's session store" in warning]
    assert store_warnings, result.warnings
    assert result.attribution is not None
    assert result.attribution.note or result.attribution.disagreements
