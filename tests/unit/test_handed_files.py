"""Which reward files a task declares, which directories the handed files make the task's, and the commands that
clear them: pure parts of the hand-over (the attacks themselves are in tests/integration/test_redteam.py)."""

from __future__ import annotations

from typing import cast

import pytest
from pydantic import ValidationError

from opencode_env.rollout import task_dirs
from opencode_env.rollout.grading.reward import Reward, read_reward
from opencode_env.sandbox.base import REWARD_JSON, REWARD_TXT, Sandbox, sealed_dirs
from opencode_env.wire import CommandResult, RolloutRequest

WORKDIR = "/home/user/workdir"


def request(**fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate({"instruction": "x", **fields})


def test_a_reward_file_counts_only_where_the_task_declares_or_names_it() -> None:
    assert request(verify=["cd /w && python3 -m pytest -q tests"]).declared_reward_files() == ()
    writes = request(verify=["true"], verify_files={"/tests/test.sh": "echo 1 > /logs/verifier/reward.txt"})
    assert writes.declared_reward_files() == ("reward.txt",)
    assert request(verify=["echo 1 > reward.txt"], reward_files=[]).declared_reward_files() == ()
    both = request(reward_files=["reward.json", "reward.txt"])
    assert set(both.declared_reward_files()) == {"reward.txt", "reward.json"}


@pytest.mark.parametrize("bad", [["reward.txt", "reward.txt"], ["score.txt"]])
def test_reward_files_are_checked(bad: list[str]) -> None:
    with pytest.raises(ValidationError, match="reward_files"):
        request(reward_files=bad)


def test_the_sealed_directories_are_those_below_the_work_dir_or_the_files_own() -> None:
    assert sealed_dirs(f"{WORKDIR}/tests/unit/test_a.py", WORKDIR) == [f"{WORKDIR}/tests", f"{WORKDIR}/tests/unit"]
    assert sealed_dirs(f"{WORKDIR}/test_a.py", WORKDIR) == []
    assert sealed_dirs("/tests/test.sh", WORKDIR) == ["/tests"]
    assert sealed_dirs("/home/user/notes.txt", WORKDIR) == []
    assert sealed_dirs("/tmp/x.py", WORKDIR) == []
    assert sealed_dirs("/app/x.py", "/app/src") == []


def test_the_task_directories_keep_only_the_tasks_names() -> None:
    plan = task_dirs.plan(["tests/test_a.py", "tests/unit/helper.py", "/tests/test.sh"], ["tests/data.txt"], WORKDIR)
    assert plan.keep == {
        "tests": frozenset({"test_a.py", "unit", "data.txt"}),
        "tests/unit": frozenset({"helper.py"}),
    }
    assert plan.markers == ("__init__.py",)
    assert task_dirs.plan(["/tests/test.sh"], [], WORKDIR) == task_dirs.TaskDirs({}, ())


class Verifier:
    """A sandbox that has only the verifier directory's files."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    async def read_tail(self, path: str, limit: int) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path][-limit:]


PASSED = [CommandResult(cmd="true", exit_code=0), CommandResult(cmd="false", exit_code=1)]


async def test_an_undeclared_reward_file_is_never_read() -> None:
    sandbox = cast(Sandbox, Verifier({REWARD_TXT: b"1", REWARD_JSON: b'{"reward": 1}'}))
    assert await read_reward(sandbox, PASSED, ()) == Reward(0.5, "verify_pass_rate")
    assert await read_reward(sandbox, PASSED, ("reward.txt",)) == Reward(1.0, "reward_txt")


async def test_both_declared_reward_files_written_is_a_conflict_graded_zero() -> None:
    sandbox = cast(Sandbox, Verifier({REWARD_TXT: b"0", REWARD_JSON: b'{"reward": 1}'}))
    reward = await read_reward(sandbox, PASSED, ("reward.json", "reward.txt"))
    assert (reward.value, reward.finding, reward.paths) == (0.0, "reward_file", (REWARD_JSON, REWARD_TXT))
    one = cast(Sandbox, Verifier({REWARD_JSON: b'{"reward": 0.25}', REWARD_TXT: b""}))
    assert await read_reward(one, PASSED, ("reward.json", "reward.txt")) == Reward(
        0.25, "reward_json", metrics={"reward": 0.25}
    )


async def test_a_reward_file_past_the_read_limit_is_no_reward_not_an_error() -> None:
    huge = cast(Sandbox, Verifier({REWARD_TXT: b"1" + b" " * (2 << 20), REWARD_JSON: b""}))
    reward = await read_reward(huge, PASSED, ("reward.txt", "reward.json"))
    assert (reward.value, reward.finding) == (0.0, "reward_unparsable")
