"""Harbor's multi-step tasks (`[[steps]]`): the loader (each step's directory read, bad step tables refused naming
the field), and the steps run on the real pipeline on the local backend: in order in one sandbox, each verified in a
fresh grader's box, a step under its min_reward stopping the run, the reward by the task's strategy, each step's
model calls told apart, and nothing of a later step in the sandbox before that step starts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opencode_env.rollout import pipeline
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.state import RolloutState
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash
from opencode_env.tasks import HarborTask, TaskFormatError
from opencode_env.tasks.harbor import request_from_task_dir
from opencode_env.training.sequences import training_sequences
from opencode_env.wire import RolloutRequest, RolloutStep
from tests.integration.test_harbor_corpus import CORPUS

STEPS_TOML = """\
schema_version = "1.1"
multi_step_reward_strategy = "final"

[[steps]]
name = "one"
min_reward = 1.0

[steps.agent]
timeout_sec = 30.0

[[steps]]
name = "two"

[steps.verifier]
timeout_sec = 45.0
env = { WANT = "2" }
"""


def steps_task(root: Path, toml: str = STEPS_TOML, *, steps: tuple[str, ...] = ("one", "two")) -> Path:
    task = root / "stepped"
    files = {
        "task.toml": toml,
        "environment/Dockerfile": "FROM scratch\n",
        "tests/helper.sh": "echo helper\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    }
    for name in steps:
        files |= {
            f"steps/{name}/instruction.md": f"Do step {name}.\n",
            f"steps/{name}/solution/solve.sh": f"echo {name} > {name}.txt\n",
        }
    files |= {"steps/two/tests/test.sh": "test -f two.txt && echo 1 > /logs/verifier/reward.txt\n"}
    files |= {"steps/two/workdir/setup.sh": "echo ready > ready.txt\n", "steps/two/workdir/data/in.txt": "x\n"}
    for relative, text in files.items():
        if relative.startswith("steps/") and relative.split("/")[1] not in steps:
            continue
        path = task / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return task


def test_each_step_maps_onto_a_step_of_the_request(tmp_path: Path) -> None:
    task = HarborTask.from_dir(steps_task(tmp_path))
    request = task.to_request("img", "/app", oracle=True)
    one, two = request.steps
    assert (request.step_reward, request.verify_sandbox, request.solution) == ("final", "fresh", [])
    assert request.instruction == "Do step one.\n" == one.instruction, "the first step's, shown only"
    assert request.verify_files.keys() == {"/tests/helper.sh", "/tests/test.sh"}, "the task's tests under every step"
    assert (one.min_reward, one.agent_timeout_s, one.verify_timeout_s, one.verify) == (1.0, 30.0, None, None)
    assert one.files == {"/solution/solve.sh": "echo one > one.txt\n"}
    assert one.setup == []
    assert two.verify_files["/tests/test.sh"].startswith("test -f two.txt"), "the step's own test.sh wins"
    assert two.verify_files["/tests/.verifier-env"] == "WANT=2\n"
    assert two.verify_timeout_s == 45.0
    assert two.files.keys() == {"setup.sh", "data/in.txt", "/solution/solve.sh"}, "workdir/ relative to the work dir"
    assert two.setup == ["bash ./setup.sh"]
    assert [step.solution for step in task.to_request("img", "/app").steps] == [[], []], "no oracle, no solution"


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[[steps]]\nname = "one"\nmin_reward = "high"\n', r"\[steps\] 0\.min_reward"),
        ('[[steps]]\nname = "one"\nmin_reward = true\n', r"\[steps\] 0\.min_reward: .*min_reward: True is not a"),
        ('[[steps]]\nname = "one"\nmin_reward = "0.5"\n', r"min_reward: '0.5' is not a number"),
        ('[[steps]]\nname = "one"\nmin_reward = { c = false }\n', r"min_reward\.c: False is not a number"),
        ('[[steps]]\nname = "one"\nmin_reward = nan\n', r"min_reward: reward = nan is not a finite number"),
        ('[[steps]]\nname = "one"\nmin_reward = { c = inf }\n', r"min_reward: c = inf is not a finite number"),
        ('[[steps]]\nname = "../up"\n', r"\[steps\] 0\.name: String should match pattern"),
        ('[[steps]]\nname = ".."\n', r"\[steps\] 0\.name: Value error, a step's name is its directory"),
        ('[[steps]]\nname = "."\n', r"\[steps\] 0\.name: Value error, a step's name is its directory"),
        ("[[steps]]\nmin_reward = 1.0\n", r"\[steps\] 0\.name: Field required"),
        ('[[steps]]\nname = "one"\n[[steps]]\nname = "one"\n', r"steps: Value error, name one declared twice"),
        ('[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = -1\n', r"\[steps\] 0\.agent\.timeout_sec"),
        ('multi_step_reward_strategy = "max"\n[[steps]]\nname = "one"\n', r"multi_step_reward_strategy: Input"),
        ('[[steps]]\nname = "one"\n[steps.verifier]\nenv = { LD_PRELOAD = "x" }\n', r"LD_PRELOAD: refused"),
    ],
)
def test_bad_step_tables_are_named(tmp_path: Path, toml: str, named: str) -> None:
    with pytest.raises(TaskFormatError, match=named):
        HarborTask.from_dir(steps_task(tmp_path, toml, steps=("one",)))


def test_a_steps_missing_or_stray_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match=r"steps/two: missing \(the directory of \[\[steps\]\] name = 'two'\)"):
        HarborTask.from_dir(steps_task(tmp_path / "a", steps=("one",)))
    stray = steps_task(tmp_path / "b")
    (stray / "steps" / "three").mkdir()
    with pytest.raises(TaskFormatError, match=r"steps: three: not declared in task.toml's \[\[steps\]\]"):
        HarborTask.from_dir(stray)


def test_a_step_with_no_verifier_anywhere_is_named(tmp_path: Path) -> None:
    task = steps_task(tmp_path)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TaskFormatError, match=r"steps/one/tests/test.sh: missing, and tests/test.sh too"):
        HarborTask.from_dir(task)


def test_an_oracle_run_needs_every_steps_solution(tmp_path: Path) -> None:
    task = steps_task(tmp_path)
    (task / "steps" / "two" / "solution" / "solve.sh").unlink()
    with pytest.raises(TaskFormatError, match=r"steps/two/solution/solve.sh: missing, so step two has no oracle"):
        HarborTask.from_dir(task).require_solution()


def test_unknown_step_keys_are_named_with_the_nearest(tmp_path: Path) -> None:
    toml = '[[steps]]\nname = "one"\nmin_rewrd = 1.0\ncontributes_to_mean = false\n[steps.agent]\ntimeout = 3\n'
    task = HarborTask.from_dir(steps_task(tmp_path, toml, steps=("one",)))
    assert "[steps one] min_rewrd: unknown key, ignored (did you mean 'min_reward'?)" in task.unknown
    assert "[steps one] contributes_to_mean: unknown key, ignored" in task.unknown
    assert "[steps one agent] timeout: unknown key, ignored (did you mean 'timeout_sec'?)" in task.unknown


def test_the_request_refuses_what_a_step_cannot_carry() -> None:
    step = RolloutStep(name="a", instruction="x")
    with pytest.raises(ValueError, match="verify_sandbox='fresh'"):
        RolloutRequest(instruction="x", steps=[step], verify_sandbox="same")
    with pytest.raises(ValueError, match="steps: a named twice"):
        RolloutRequest(instruction="x", steps=[step, step])
    files = {f"/tests/{n}": "x" * 1_000_000 for n in range(6)}
    big = [RolloutStep(name=f"s{i}", instruction="x", verify_files=files) for i in range(3)]
    with pytest.raises(ValueError, match="steps: 18000000 characters of files and verify_files in all, over the limit"):
        RolloutRequest(instruction="x", steps=big)
    with pytest.raises(ValueError, match=r"steps\[0\].verify_files: "):
        RolloutRequest(instruction="x", steps=[RolloutStep(name="a", instruction="x", verify_files={"../x": "y"})])


@pytest.fixture(scope="module")
def greet() -> RolloutRequest:
    return request_from_task_dir(CORPUS / "multi-step-greet", oracle=True)


def _solved_only(request: RolloutRequest, *names: str) -> RolloutRequest:
    steps = [step if step.name in names else step.model_copy(update={"solution": []}) for step in request.steps]
    return request.model_copy(update={"steps": steps})


@pytest.mark.timeout(900)
async def test_mean_and_final(backend: LocalBackend, greet: RolloutRequest) -> None:
    """Step one solved (1.0, at its min_reward), step two not (0.0, under its own): the mean is 0.5, the final 0.0."""
    half = _solved_only(greet, "scaffold")
    mean = await run_rollout(half, backend)
    final = await run_rollout(half.model_copy(update={"step_reward": "final"}), backend)
    for result in (mean, final):
        assert [(s.status, s.reward) for s in result.steps] == [("completed", 1.0), ("below_min_reward", 0.0)]
        assert result.status == "completed"
    assert (mean.reward, final.reward) == (0.5, 0.0)
    assert [r.cmd for r in mean.solution_results] == ["bash /solution/solve.sh"], "step two's solution was emptied"
    assert len(mean.verify_results) == 2, "each step's verify ran"


WALK = textwrap.dedent(
    """\
    import os, sys
    canary = ("CAN" + "ARY-" + "5e7d").encode()
    found = []
    for top in ("/",):
        for root, dirs, files in os.walk(top):
            if root == "/":
                dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
            for name in files:
                path = os.path.join(root, name)
                try:
                    if os.path.isfile(path) and not os.path.islink(path) and canary in open(path, "rb").read():
                        found.append(path)
                except OSError:
                    pass
            found += [os.path.join(root, name) for name in dirs + files if canary in name.encode()]
    open("found.txt", "w").write("".join(line + "\\n" for line in found))
    """
)


@pytest.mark.timeout(900)
async def test_nothing_of_a_later_step_is_in_the_sandbox_before_it(backend: LocalBackend) -> None:
    """Step one's solution runs as the sandbox's root (more than the agent may see) and reads every file and every
    name of the sandbox: step two's instruction, tests, files, setup and solution (each carrying the canary) are
    nowhere. Step two's own walk then finds its files (the walk sees what is there) but never its tests."""
    canary = "CANARY-5e7d"
    walk = [f"python3 - <<'EOF'\n{WALK}EOF"]
    later = RolloutStep(
        name="two",
        instruction=f"Step two {canary}.",
        files={f"{canary}.txt": canary, "/tmp/seed": canary},
        setup=[f"echo {canary} > /tmp/setup-{canary}"],
        verify_files={f"/tests/{canary}.sh": canary},
        verify=[f"! grep -q -e ^/tests -e ^/solution found.txt && grep -q {canary}.txt found.txt"],
        solution=walk,
    )
    first = RolloutStep(name="one", instruction="Step one.", verify=["test ! -s found.txt"], solution=walk)
    request = RolloutRequest(
        instruction="x", steps=[first, later], solution=[], solution_as="root", step_reward="final"
    )
    result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert [(s.name, s.status, s.reward) for s in result.steps] == [
        ("one", "completed", 1.0),
        ("two", "completed", 1.0),
    ]
    assert result.solution_results[0].exit_code == 0, result.solution_results
    found = sorted(result.files["found.txt"].splitlines())
    assert f"/home/user/workdir/{canary}.txt" in found, "the walk sees what is there"
    assert "/tmp/seed" in found
    assert not [path for path in found if path.startswith("/tests") or "/solution" in path], found


async def test_each_steps_turns_are_its_own(backend: LocalBackend) -> None:
    """A real agent (OpenCode and the scripted model, which plays its sub_script in the second session) through two
    steps: each step is a root session of its own, its calls `proxy_turns[first_turn:end_turn]`."""
    task = CORPUS / "multi-step-greet"
    scaffold = Script(steps=[bash("printf '#!/bin/bash\\necho Hello\\n' > greet.sh", "scaffold")])
    implement = Script(steps=[bash("printf '#!/bin/bash\\necho \"Hello, $1!\"\\n' > greet.sh", "implement")])
    with ScriptedModelServer(scaffold, sub_script=implement) as model:
        request = request_from_task_dir(task, endpoint="vllm", base_url=model.base_url, model=model.model.model_name)
        steps = [step.model_copy(update={"agent_timeout_s": 300.0}) for step in request.steps]  # a loaded machine
        result = await run_rollout(request.model_copy(update={"steps": steps}), backend)
    assert result.status == "completed", result.error
    assert [(s.status, s.reward) for s in result.steps] == [("completed", 1.0), ("completed", 1.0)], result.steps
    assert result.reward == 1.0
    one, two = result.steps
    assert 0 == one.first_turn < one.end_turn == two.first_turn < two.end_turn == len(result.proxy_turns)
    sessions = [{t.session_id for t in result.proxy_turns[s.first_turn : s.end_turn]} for s in result.steps]
    assert len(sessions[0]) == len(sessions[1]) == 1, sessions
    assert sessions[0] != sessions[1]
    assert {turn.kind for turn in result.proxy_turns} == {"agent"}, "each step's session is a root, no sub-agent"
    numbers = [{t.turn for t in result.proxy_turns[s.first_turn : s.end_turn]} for s in result.steps]
    found = training_sequences(result)
    assert all(any(set(seq.turns) <= step for step in numbers) for seq in found.sequences), "a sequence spans steps"
    started = [(seq.started, seq.session_id) for seq in found.sequences]
    assert started == [("first", *sessions[0]), ("step", *sessions[1])]
    assert found.forks == [], "a step's first call is a new session, not a fork"


async def test_doing_nothing_stops_at_the_first_steps_min_reward(backend: LocalBackend, greet: RolloutRequest) -> None:
    result = await run_rollout(greet.doing_nothing(), backend)
    assert (result.status, result.reward) == ("completed", 0.0), result.error
    assert [s.status for s in result.steps] == ["below_min_reward", "not_run"]
    assert result.steps[0].error == "reward 0 is below the step's min_reward 1"
    assert len(result.verify_results) == 1, "step two's verify never ran"
    assert any(n.code == "steps_not_run" and "implement" in n.message for n in result.notices), result.notices


@pytest.mark.timeout(900)
@pytest.mark.parametrize("in_the_way", ["ln -s /etc/hostname data.txt", "mkdir -p data.txt/x"])
async def test_an_agent_that_blocks_the_next_steps_files_gets_0_for_it(backend: LocalBackend, in_the_way: str) -> None:
    """Step one's agent (the oracle, as the agent's identity) leaves a link or a directory where step two's file goes:
    the write is refused (no link followed), and that is the agent's doing: a policy outcome, step two graded 0.0 (so
    breaking a step never keeps the mean of the steps before it), step three not run."""
    steps = [
        RolloutStep(name="one", instruction="x", solution=[in_the_way], verify=["true"]),
        RolloutStep(name="two", instruction="y", files={"data.txt": "the task's"}, verify=["true"]),
        RolloutStep(name="three", instruction="z", verify=["true"]),
    ]
    result = await run_rollout(RolloutRequest(instruction="x", steps=steps, solution=[]), backend)
    assert (result.status, result.failed_phase) == ("agent_error", "prepare"), result.error
    assert [(s.status, s.reward) for s in result.steps] == [("completed", 1.0), ("failed", 0.0), ("not_run", None)]
    assert result.reward == 0.5
    assert "data.txt: the step's file could not be written where the agent left something" in (result.error or "")


@pytest.mark.timeout(900)
async def test_a_later_steps_setup_the_agent_broke_is_graded_0(backend: LocalBackend) -> None:
    """Step one's agent deletes the file step two's setup needs: step two's setup fails (setup_failed, as for any
    task), and the step is graded 0.0, not left out of the mean."""
    steps = [
        RolloutStep(name="one", instruction="x", files={"keep.txt": "k"}, solution=["rm keep.txt"], verify=["true"]),
        RolloutStep(name="two", instruction="y", setup=["test -f keep.txt"], verify=["true"]),
    ]
    result = await run_rollout(RolloutRequest(instruction="x", steps=steps, solution=[]), backend)
    assert (result.status, result.failed_phase) == ("setup_failed", "setup"), result.error
    assert [(s.status, s.reward) for s in result.steps] == [("completed", 1.0), ("failed", 0.0)]
    assert result.reward == 0.5
    assert (result.steps[1].error or "").startswith("graded 0: the step could not run after the earlier steps' agent")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend_name", ["backend", "e2b_fake", "hf_fake"])
async def test_each_steps_grader_box_replays_the_steps_so_far(
    backend_name: str, request: pytest.FixtureRequest, no_leaks: None
) -> None:
    """Step two's grader's box replays step one's setup too: its verify reads the file that setup wrote outside the
    work dir (which the copy of the agent's work dir never carries). On the clouds the box opens when the agent
    ends, locally beside it; alike on each."""
    cloud: SandboxBackend = request.getfixturevalue(backend_name)
    steps = [
        RolloutStep(
            name="one",
            instruction="x",
            setup=["echo one > /home/user/one && chmod 644 /home/user/one"],
            solution=["echo 1 > a.txt"],
            verify=["test -f a.txt"],
            min_reward=1.0,
        ),
        RolloutStep(
            name="two",
            instruction="y",
            solution=["echo 2 > b.txt"],
            verify=["test -f a.txt && test -f b.txt && test -f /home/user/one"],
        ),
    ]
    result = await run_rollout(RolloutRequest(instruction="x", steps=steps, solution=[]), cloud)
    assert (result.status, result.reward) == ("completed", 1.0), (result.error, result.verify_results)
    assert [(s.status, s.reward) for s in result.steps] == [("completed", 1.0), ("completed", 1.0)]
    assert result.grade_isolation == "fresh_box"


HARD_LINKS = """python3 - <<'EOF'
import os
for start in range(0, 60000, 20000):
    base = f'/home/user/.opencode/d{start}'
    os.makedirs(base)
    open(f'{base}/x', 'w').close()
    for index in range(start, start + 20000):
        os.link(f'{base}/x', f'{base}/l{index}')
EOF"""


async def test_what_step_ones_agent_leaves_in_the_way_is_its_zero_never_an_infrastructure_failure(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before each step's agent, OpenCode's project configuration is removed from the work dir and every directory
    above it. Step one's agent fills /home/user/.opencode (above the work dir) with hard links (no inode each), more
    than the removal can take in its time: step two is the agent's 0 (agent_error, in the mean), never a
    sandbox_error that would drop the whole rollout's reward. The removal's time is scaled down (0.1 s after an
    agent; ~2M links pass the real 30 s), so 60,000 links do it."""
    removal = pipeline._remove_opencode_project_config

    async def in_less_time(rollout: RolloutState) -> None:
        monkeypatch.setattr(pipeline, "PROJECT_CONFIG_TIMEOUT_S", 0.1 if rollout.after_agent else 30.0)
        await removal(rollout)

    monkeypatch.setattr(pipeline, "_remove_opencode_project_config", in_less_time)
    steps = [
        RolloutStep(name="one", instruction="x", solution=[HARD_LINKS], verify=["true"]),
        RolloutStep(name="two", instruction="y", verify=["true"]),
    ]
    request = RolloutRequest(instruction="x", steps=steps, solution=[], solution_as="user")
    result = await run_rollout(request, backend)
    assert [ran.exit_code for ran in result.solution_results] == [0], (result.error, result.solution_results)
    assert (result.status, result.failed_phase) == ("agent_error", "setup"), result.error
    assert [(s.status, s.reward) for s in result.steps] == [("completed", 1.0), ("failed", 0.0)]
    assert result.reward == 0.5
