"""The pipeline end to end: the real OpenCode, the scripted model on loopback, the local backend.

A real OpenCode run is the suite's biggest cost, so tests that only read a result share one (SHARED, each run once
for the module and leak-checked right after):
- "half verify": the verify pass-rate test and the instruction test. Verify's commands act on the work dir after the
  agent, the instruction is only what OpenCode sends the model (the scripted model ignores it), so neither part can
  change what the other test reads; the task's file is uploaded rather than written by the agent, whose work is not
  what either test checks.
- "work": the absolute-paths test and the task-files test. Their files have different names, their agent steps
  write text files only except the one binary file (so `files_extra` stays exactly that one), and verify's first
  command is the task file's (its stdout is the one read) while a reward of 1.0 still needs every command to pass.

The rest cannot share: each reward-file rollout ends with its own reward (one rollout has one reward), the pass-rate
and "work" rollouts assert different rewards from their verify lists, the timed-out agent ends in its own status,
and the failing setup never starts OpenCode.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.script import Script, bash, demo_script, say, stall, write
from tests.helpers import rollout
from tests.shared_rollouts import Plan, SharedRollouts

INSTRUCTION = (
    "Quote 'single' \"double\" `backtick` $HOME ${PATH} $(whoami) \\n literal\n"
    "tab\there; semi; && || > < | * ? [x] ~ # !\n"
    "unicode: é ß 中文 🚀 \u2028 line sep \u0085 next line\n\n  trailing spaces  "
)
HALF_VERIFY = ["test -f /home/user/workdir/add.py", "test -f /home/user/workdir/missing.py"]
WORK_VERIFY = [
    "python3 /home/user/workdir/src/app.py",
    'test "$(cat /home/user/workdir/out.txt)" = 42',
    "test -f /home/user/workdir/notes/log.md",
]
SHARED = {
    "half verify": Plan(
        Script(steps=[say("ok")]),
        {"files": {"add.py": "def add(a, b):\n    return a + b\n"}, "instruction": INSTRUCTION, "verify": HALF_VERIFY},
    ),
    "work": Plan(
        Script(
            steps=[
                bash(
                    "n=$(cat /home/user/workdir/n.txt); echo $((n + 1)) > /home/user/workdir/out.txt"
                    " && printf '\\x00\\x01' > /home/user/workdir/blob.bin",
                    "Increment",
                ),
                write("/home/user/workdir/notes/log.md", "# done\n"),
                say("Incremented."),
            ]
        ),
        {
            "setup": ["echo 41 > /home/user/workdir/n.txt"],
            "files": {"src/app.py": "print('hi')\n"},
            "verify": WORK_VERIFY,
        },
    ),
}


@pytest.fixture(scope="module")
def shared(backend: LocalBackend, leak_check: Callable[[], None]) -> SharedRollouts:
    return SharedRollouts(backend, SHARED, leak_check)


async def test_one_of_two_verify_commands_failing_gives_half(shared: SharedRollouts) -> None:
    result = (await shared.get("half verify")).result
    assert (result.reward, result.reward_source) == (0.5, "verify_pass_rate")
    assert [r.exit_code for r in result.verify_results] == [0, 1]
    assert [r.cmd for r in result.verify_results] == HALF_VERIFY


async def test_a_declared_reward_file_overrides_pass_rate_and_two_written_grade_zero(
    backend: LocalBackend, no_leaks: None
) -> None:
    verify = ["exit 1", "echo 0.25 > /home/user/logs/verifier/reward.txt"]
    result = (await rollout(backend, Script(steps=[say("ok")]), verify=verify)).result
    assert (result.reward, result.reward_source) == (0.25, "reward_txt")
    json_verify = [*verify, "echo '{\"reward\": 0.75}' > /home/user/logs/verifier/reward.json"]
    declared = await rollout(backend, Script(steps=[say("ok")]), verify=json_verify, reward_files=["reward.json"])
    assert (declared.result.reward, declared.result.reward_source) == (0.75, "reward_json")
    result = (await rollout(backend, Script(steps=[say("ok")]), verify=json_verify)).result
    assert (result.reward, result.status, result.failed_phase) == (0.0, "agent_error", "verify"), result.error
    assert {(finding.kind, finding.response) for finding in result.integrity} == {("reward_file", "graded_zero")}


async def test_failing_setup_stops_the_rollout(backend: LocalBackend, no_leaks: None) -> None:
    setup = ["echo first > /home/user/workdir/first.txt", "echo broken >&2; exit 3", "touch /home/user/workdir/x"]
    outcome = await rollout(backend, demo_script(), setup=setup)
    result = outcome.result
    assert (result.status, result.failed_phase) == ("setup_failed", "setup")
    assert [r.exit_code for r in result.setup_results] == [0, 3]
    assert result.setup_results[1].stderr == "broken\n"
    assert "setup command 2 exited 3" in (result.error or "")
    assert outcome.exchanges == []
    assert result.agent_exit_code is None
    assert result.verify_results == []
    assert result.reward is None


async def test_agent_past_its_deadline_is_stopped_and_verified(backend: LocalBackend, no_leaks: None) -> None:
    outcome = await rollout(
        backend, Script(steps=[stall(120)]), agent_timeout_s=5.0, verify=["test ! -f /home/user/workdir/add.py"]
    )
    result = outcome.result
    assert (result.status, result.failed_phase) == ("agent_timeout", "agent")
    assert result.agent_exit_code is None
    assert (result.timings.agent_s or 0) >= 5.0
    assert [r.exit_code for r in result.verify_results] == [0]
    assert result.reward == 1.0


async def test_instruction_reaches_the_model_byte_for_byte(shared: SharedRollouts) -> None:
    outcome = await shared.get("half verify")
    assert outcome.result.status == "completed", outcome.result.error
    user_messages = [m for m in outcome.exchanges[0].request["messages"] if m["role"] == "user"]
    assert user_messages[0]["content"] == INSTRUCTION


async def test_absolute_home_user_paths_work(shared: SharedRollouts) -> None:
    result = (await shared.get("work")).result
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert result.files["out.txt"] == "42\n"
    assert result.files["notes/log.md"] == "# done\n"


async def test_task_files_are_uploaded_and_binary_outputs_listed(shared: SharedRollouts) -> None:
    result = (await shared.get("work")).result
    assert result.verify_results[0].stdout == "hi\n"
    assert result.files["src/app.py"] == "print('hi')\n"
    assert result.files_extra == ["blob.bin"]
