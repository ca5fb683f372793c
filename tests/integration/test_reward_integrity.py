"""A hostile agent against its own grade: the real OpenCode runs each attack through its bash tool (the scripted
model emits the commands), and each attack must fail: the reward is what an honest verify gives (0.0 for a failing
verify, 1.0 for honest work), never 1.0 for a failing verify and never None, and the result serialises and parses.

Classes (the issue's): hooks verify would load from the agent's HOME, /tmp or configuration; breaking a directory
the pipeline uses or leaving odd names, to turn a failure into an infrastructure failure; calls OpenCode did not
make, and killing OpenCode; planting tests the task restores; verify in a fresh sandbox.

Attacks that act on different things share one rollout (a real OpenCode run is the suite's biggest cost), each
checked on its own: the four hooks in one bash step, each leaving its own marker; breakages of different paths
together; see the plans in SHARED for why each group's attacks cannot mask each other. Attacks on the same path
(the logs dir as a link, as a file, its verifier dir as a link) stay in rollouts of their own.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import DEMO_VERIFY
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash, say, write
from opencode_env.wire import RolloutResult
from tests.helpers import Outcome, rollout
from tests.shared_rollouts import Plan, SharedRollouts

REWARD = "/home/user/logs/verifier/reward.txt"
ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
WRITE_REWARD = f"open({REWARD!r}, 'w').write('1')"
SITE = "python3 -c 'import site; print(site.getusersitepackages())'"


def python_hook(name: str) -> str:
    """A hook's Python line: prints HOOK-<name> and writes the reward. The marker is spelled in two literals, so
    only the hook running prints it whole (the command that plants it never holds it)."""
    return f"import os; print('HOOK' '-{name}'); {WRITE_REWARD}"


HOOKS = {
    "usercustomize": ("usercustomize", f'echo "{python_hook("usercustomize")}" > "$site/usercustomize.py"'),
    "pth file": ("pth", f'echo "{python_hook("pth")}" > "$site/zz-hook.pth"'),
    "git fsmonitor": (
        "fsmonitor",
        f"printf '#!/bin/sh\\necho HOOK\"-\"fsmonitor >&2\\necho 1 > {REWARD}\\n' > /home/user/hook.sh && "
        "chmod +x /home/user/hook.sh && git config --global core.fsmonitor /home/user/hook.sh && "
        "git -C /home/user/workdir init -q",
    ),
    "the grader's own HOME in /tmp": ("tmp-home", f'echo "{python_hook("tmp-home")}" > "$tmpsite/usercustomize.py"'),
}
"""Each hook: its marker and how the agent plants it. They cannot mask each other: each lives in its own file
(the user site of /home/user, of HOME=/tmp/home, git's global config), each writes the reward on its own and prints
its own marker, and a hook failing never stops another from running (site.py goes on past a failing .pth line or
usercustomize; git and Python are separate programs)."""
PLANT_HOOKS = " && ".join(
    [
        f"site=$({SITE}) && tmpsite=$(HOME=/tmp/home {SITE})",
        'mkdir -p "$site" "$tmpsite"',
        *(plant for _, plant in HOOKS.values()),
    ]
)
PROBE_HOOKS = "python3 -c pass; HOME=/tmp/home python3 -c pass; git -C /home/user/workdir status >/dev/null"
"""The agent runs what each hook hooks, so each hook is shown to run where it was planted (its marker in the tool's
output) before verify is shown not to run it. The reward each writes then is the agent's, which verify replaces."""
HOOK_VERIFY = ["cd /home/user/workdir && git status; python3 -c 'import sys; sys.exit(1)'"]
"""A failing verify that runs Python (the site hooks) and git status (the fsmonitor), with their output kept."""


def roundtrips(result: RolloutResult) -> RolloutResult:
    wire = result.model_dump_json()
    again = RolloutResult.model_validate_json(wire)
    assert again.model_dump_json() == wire
    return again


def tool_outputs(outcome: Outcome) -> str:
    """What the agent's tools printed, as OpenCode sent it back to the model."""
    return json.dumps([exchange.request.get("messages", []) for exchange in outcome.exchanges])


@pytest.fixture(scope="module")
def shared(backend: LocalBackend, leak_check: Callable[[], None]) -> SharedRollouts:
    return SharedRollouts(backend, SHARED, leak_check)


def verify_output(result: RolloutResult) -> str:
    return "".join(command.stdout + command.stderr for command in result.verify_results)


@pytest.mark.parametrize("hook", sorted(HOOKS))
async def test_hooks_the_agent_plants_never_run_in_verify(shared: SharedRollouts, hook: str) -> None:
    outcome = await shared.get("hooks")
    result = roundtrips(outcome.result)
    marker = "HOOK-" + HOOKS[hook][0]
    assert marker in tool_outputs(outcome), "the hook never ran for the agent: planted where nothing loads it"
    assert result.status == "completed", result.error
    assert marker not in verify_output(result), result.verify_results
    assert not any(marker in text for text in result.files.values())
    assert (result.reward, result.reward_source) == (0.0, "verify_pass_rate")


BREAKAGES = {
    "logs made a link to /tmp": "mv /home/user/logs /home/user/logs.old && ln -s /tmp /home/user/logs",
    "logs made a file": "rm -rf /home/user/logs && echo x > /home/user/logs",
    "the verifier dir made a link": "rm -rf /home/user/logs/verifier && ln -s /etc /home/user/logs/verifier",
    "opencode's data dir attacked": "rm -rf /home/opencode 2>&1; ls /home/opencode 2>&1; true",
}
BREAKAGE_ROLLOUT = {
    "logs made a link to /tmp": "logs as a link, opencode's data dir, odd names",
    "opencode's data dir attacked": "logs as a link, opencode's data dir, odd names",
    "logs made a file": "logs as a file",
    "the verifier dir made a link": "the verifier dir as a link, killing opencode",
}
"""The breakages of /home/user/logs each in a rollout of its own (each acts on that path: one would undo another)."""


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
async def test_breaking_a_directory_we_use_keeps_the_honest_reward(shared: SharedRollouts, breakage: str) -> None:
    outcome = await shared.get(BREAKAGE_ROLLOUT[breakage])
    result = roundtrips(outcome.result)
    assert result.status == "completed", result.error
    assert (result.reward, result.reward_source) == (1.0, "reward_txt")


async def test_a_work_dir_replaced_by_a_link_is_graded_as_empty(backend: LocalBackend, no_leaks: None) -> None:
    script = Script(
        steps=[
            write("/home/user/workdir/add.py", ADD),
            bash("cd /home/user && mv workdir elsewhere && ln -s /etc workdir"),
            say("done"),
        ]
    )
    result = roundtrips((await rollout(backend, script)).result)
    assert result.status == "completed", result.error
    assert result.reward == 0.0
    assert "passwd" not in result.files


ODD_NAMES = (
    "cd /home/user/workdir && python3 -c \"open(b'bin\\xe9.txt', 'wb').write(b'x'); "
    "open('new\\nline.txt', 'w').write('y'); open('n' * 255, 'w').write('z')\""
)


async def test_odd_file_names_leave_a_result_that_serialises(shared: SharedRollouts) -> None:
    result = roundtrips((await shared.get("logs as a link, opencode's data dir, odd names")).result)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert "new\nline.txt" in result.files
    assert "n" * 255 in result.files
    assert [base64.b64decode(name.path_base64) for name in result.files_non_utf8] == [b"bin\xe9.txt"]
    assert not any("bin" in name for name in [*result.files, *result.files_extra])


FORGE = """python3 - <<'EOF'
import glob, json, os, urllib.request
found = {name: value for name, value in os.environ.items() if name.startswith("OPENCODE_ENV")}
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        found[path] = open(path, "rb").read().decode(errors="replace")[:60]
    except OSError as error:
        found[path] = type(error).__name__
print("HUNT", json.dumps(found)[:400])
config = json.load(open(os.environ.get("OPENCODE_CONFIG", "/run/opencode-env/opencode.json")))
base = next(iter(config["provider"].values()))["options"]["baseURL"]
tokens = [value for name, value in os.environ.items() if "KEY" in name or "TOKEN" in name] or ["none"]
body = {"model": "policy", "n": 64, "best_of": 64, "stream": True,
        "messages": [{"role": "user", "content": "FORGED call"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}
for token in tokens:
    request = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + token, "content-type": "application/json",
                 "user-agent": "opencode/1.18.33 ai-sdk/openai-compatible"})
    try:
        print("FORGE", urllib.request.urlopen(request, timeout=20).status)
    except Exception as error:
        print("FORGE", type(error).__name__, getattr(error, "code", ""))
EOF"""


async def test_calls_opencode_did_not_make_are_never_recorded(shared: SharedRollouts) -> None:
    outcome = await shared.get("forged calls, protected files")
    result = roundtrips(outcome.result)
    assert result.status == "completed", result.error
    forged = [exchange for exchange in outcome.exchanges if exchange.request["messages"][0]["content"] == "FORGED call"]
    assert forged == []
    assert "FORGE HTTPError 401" in tool_outputs(outcome)
    assert len(result.proxy_turns) == len(outcome.exchanges) == result.usage.llm_calls == 3
    assert all(turn.kind == "agent" and turn.clamped == {} for turn in result.proxy_turns)
    assert result.reward == 1.0


KILL_OPENCODE = (
    'python3 -c "import json, os, urllib.request; '
    "c = json.load(open(os.environ.get('OPENCODE_CONFIG', '/run/opencode-env/opencode.json'))); "
    "u = next(iter(c['provider'].values()))['options']['baseURL'] + '/chat/completions'; "
    "t = os.environ.get('OPENCODE_ENV_UPSTREAM_KEY', 'none'); "
    "urllib.request.urlopen(urllib.request.Request(u, data=b'{not json', headers={'authorization': 'Bearer ' + t}))"
    '" 2>&1 | tail -1; pkill -KILL -x opencode; pkill -KILL -x .opencode; kill -KILL $PPID; echo still here'
)


async def test_the_agent_cannot_kill_opencode_or_spoil_its_proxy(shared: SharedRollouts) -> None:
    """A malformed call to its own proxy, then killing OpenCode: OpenCode lives on and the model never failed."""
    outcome = await shared.get("the verifier dir as a link, killing opencode")
    result = roundtrips(outcome.result)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert result.agent_exit_code == 0


PROTECTED_TEST = "import sys\nfrom add import add\nsys.exit(0 if add(2, 3) == 5 else 1)\n"
PROTECTED = {
    "verify": ["cd /home/user/workdir && python3 -m tests.test_add"],
    "verify_files": {"tests/test_add.py": PROTECTED_TEST},
}
PLANT_TESTS = (
    "ls /home/user/workdir/tests 2>&1; mkdir -p /tmp/mine && echo 'import sys; sys.exit(0)' > /tmp/mine/test_add.py "
    "&& ln -s /tmp/mine /home/user/workdir/tests && ls -la /home/user/workdir/tests/"
)


async def test_protected_files_replace_what_the_agent_left_and_are_never_seen(
    backend: LocalBackend, no_leaks: None
) -> None:
    script = Script(steps=[write("/home/user/workdir/add.py", WRONG_ADD), bash(PLANT_TESTS), say("done")])
    outcome = await rollout(backend, script, **PROTECTED)
    result = roundtrips(outcome.result)
    assert result.status == "completed", result.error
    assert "No such file or directory" in tool_outputs(outcome)
    assert (result.reward, result.reward_source) == (0.0, "verify_pass_rate")
    assert "tests/test_add.py" not in result.files, "protected files go into the grader's box alone"
    assert ("tests", "link") in {(item.path, item.kind) for item in result.integrity}


async def test_protected_files_let_honest_work_pass(shared: SharedRollouts) -> None:
    """The honest add.py under the protected test passes (its rollout also tries forged calls, which touch no file
    and no grade: see SHARED)."""
    outcome = await shared.get("forged calls, protected files")
    assert "tests/test_add.py" not in outcome.result.files, "protected files go into the grader's box alone"
    assert (outcome.result.reward, outcome.result.reward_source) == (1.0, "verify_pass_rate")
    assert outcome.result.status == "completed"


async def test_a_fresh_verify_sees_the_work_dir_and_nothing_else(backend: LocalBackend, no_leaks: None) -> None:
    plant = "echo x > /home/user/planted && echo y > /tmp/planted && echo z > /home/user/workdir/notes.txt"
    script = Script(steps=[write("/home/user/workdir/add.py", ADD), bash(plant), say("done")])
    outside = "test ! -e /home/user/planted && test ! -e /tmp/planted && test -f /home/user/workdir/notes.txt"
    outcome = await rollout(
        backend, script, verify=[outside, *DEMO_VERIFY], verify_sandbox="fresh", setup=["echo setup > /tmp/setup"]
    )
    result = roundtrips(outcome.result)
    assert result.status == "completed", result.error
    assert [command.exit_code for command in result.verify_results] == [0, 0, 0]
    assert (result.reward, result.reward_source) == (1.0, "reward_txt")
    assert result.enforcement["verify"].startswith("grader's sandbox local-")


async def test_a_full_disk_is_the_agents_outcome(backend: LocalBackend, no_leaks: None) -> None:
    fill = "head -c 400M /dev/zero > /home/user/workdir/fill 2>&1; df -h /home/user | tail -1"
    script = Script(steps=[write("/home/user/workdir/add.py", ADD), bash(fill), say("done")])
    outcome = await rollout(backend, script, disk_mb=128, **PROTECTED)
    result = roundtrips(outcome.result)
    assert result.status in ("completed", "agent_error"), result.error
    assert (result.reward, result.reward_source) == (1.0, "verify_pass_rate")
    assert "fill" in result.files_extra
    assert "disk" in result.limits_hit


TOOL_TIMEOUT = Step(
    tool_calls=[ToolCallStep(name="bash", arguments={"command": "sleep 90", "description": "wait", "timeout": 2000})]
)


async def test_opencode_still_stops_a_tool_command_past_its_timeout(shared: SharedRollouts) -> None:
    """OpenCode and its tools are two uids now: its own tool timeout must still end the command (it holds kill)."""
    outcome = await shared.get("hooks")
    assert outcome.result.status == "completed", outcome.result.error
    assert "terminated command after exceeding timeout 2000 ms" in tool_outputs(outcome)


def in_turn(*commands: str) -> str:
    """Several attacks as one bash command (one tool step), each in a subshell of its own."""
    return "; ".join(f"({command})" for command in commands)


HONEST = write("/home/user/workdir/add.py", ADD)
SHARED = {
    "hooks": Plan(
        Script(steps=[bash(f"{PLANT_HOOKS}; {PROBE_HOOKS}"), TOOL_TIMEOUT, say("planted")]),
        {"verify": HOOK_VERIFY, "task_id": "hook"},
    ),
    "logs as a link, opencode's data dir, odd names": Plan(
        Script(
            steps=[
                HONEST,
                bash(
                    in_turn(BREAKAGES["opencode's data dir attacked"], ODD_NAMES, BREAKAGES["logs made a link to /tmp"])
                ),
                say("done"),
            ]
        ),
        {"task_id": "breaker"},
    ),
    "logs as a file": Plan(
        Script(steps=[HONEST, bash(BREAKAGES["logs made a file"]), say("done")]), {"task_id": "breaker"}
    ),
    "the verifier dir as a link, killing opencode": Plan(
        Script(steps=[HONEST, bash(f"{BREAKAGES['the verifier dir made a link']}; {KILL_OPENCODE}"), say("done")]),
        {"task_id": "breaker"},
    ),
    "forged calls, protected files": Plan(Script(steps=[HONEST, bash(FORGE), say("done")]), PROTECTED),
}
"""The shared rollouts, and why the attacks of each cannot mask each other:
- hooks: see HOOKS; the tool timeout's step (a `sleep` OpenCode must end) runs no Python and no git, and its own
  message is what its test reads.
- opencode's data dir (/home/opencode), odd names (inside the work dir) and logs as a link (/home/user/logs, last):
  three paths apart. Each breakage can only cost the honest grade (the test wants 1.0 from reward.txt and status
  completed), odd names only the files' listing and the result's parsing, which its own test reads.
- the verifier dir as a link, then killing OpenCode (last: it ends its own shell): the link acts on the grade's
  directory, the kill on OpenCode and its proxy; either getting through shows on its own (the reward or status for
  the link; OpenCode's exit code or the status for the kill), and neither can raise a grade.
- forged calls with the honest answer under a protected test: the forged calls act on the proxy only (no file, no
  grade); the forge's test counts the proxy's turns, honest work's reads the grade from the protected test.
"""
