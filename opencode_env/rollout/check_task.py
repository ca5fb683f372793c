"""`check-task`: is the task solvable (its oracle reaches 1.0) and not free (doing nothing
scores below 1.0)? A task file is a RolloutRequest in JSON whose `solution` holds the reference solution."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Literal

from opencode_env.rollout.grading.graded_tests import MUTANT_PASSED
from opencode_env.rollout.grading.integrity import GRADER_CONFIG_NAMES
from opencode_env.rollout.grading.test_shape import ModeChoice, choose_mode
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.wire import RolloutRequest, RolloutResult, is_infrastructure_failure

Verdict = Literal["ok", "broken", "inconclusive"]
EXIT_CODES: dict[Verdict, int] = {"ok": 0, "broken": 1, "inconclusive": 2}


@dataclass(frozen=True)
class TaskCheck:
    oracle: RolloutResult | None
    """None when the task has no solution (only doing nothing was run)."""
    nothing: RolloutResult
    verdict: Verdict
    reason: str
    warnings: tuple[str, ...] = ()
    other_mode: RolloutResult | None = None
    """For a task graded by tests, the oracle run in the mode the task does not resolve to (else None)."""
    choice: ModeChoice | None = None
    """The mode the task's tests run in, and why (declared, or auto's reading of the tests)."""

    @property
    def by_value_applies(self) -> bool:
        """The oracle reaches 1.0 by value (the task's own mode or the other)."""
        if self.choice is None:
            return False
        run = self.oracle if self.choice.mode == "by_value" else self.other_mode
        return run is not None and run.reward == 1.0


UNREAD_REWARD = frozenset({"reward_unparsable", "reward_out_of_range"})
"""Findings on the oracle's own reward: the task's file says something other than what the request expects."""
TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")
RUNS_PYTEST = re.compile(r"(^|[\s/;&|(])(py\.test|pytest)(\s|$)|-m\s+pytest")


def task_warnings(request: RolloutRequest) -> list[str]:
    """What lets an agent move its grade without solving the task, as far as the request shows it: tests it can
    edit (written before it runs and not handed over again), grader configuration the task lets it keep."""
    warnings = []
    runs_pytest = any(RUNS_PYTEST.search(command) for command in request.verify)
    if runs_pytest and not request.verify_files:
        warnings.append(
            "verify runs pytest but hands over no protected tests (verify_files): the agent can edit the tests it "
            "is graded by; hand them over in verify_files (written in just before verify, replacing the agent's)"
        )
    for path in sorted(request.files):
        if TEST_FILE.search(path) and path not in request.verify_files:
            warnings.append(
                f"{path} is written before the agent runs and not handed over again in verify_files: the agent can "
                "change what verify runs"
            )
    for path in request.solution_files:
        if TEST_FILE.search(path) or path.rsplit("/", 1)[-1] in GRADER_CONFIG_NAMES:
            warnings.append(f"solution_files names {path}: the agent's version of it configures the grader, unchecked")
    return warnings


def judge(oracle: RolloutResult, nothing: RolloutResult) -> tuple[Verdict, str]:
    """The verdict on a task from its oracle run and its do-nothing run."""
    for name, run in (("oracle", oracle), ("do-nothing", nothing)):
        if is_infrastructure_failure(run.status):
            return "inconclusive", f"the {name} run failed on our side ({run.status}): {run.error}"
        if run.verify_network_failure is not None:
            return "inconclusive", f"the {name} run's verify failed to reach the network: {run.verify_network_failure}"
    if oracle.status == "setup_failed":
        return "broken", f"setup fails, so nothing can solve it: {oracle.error}"
    unread = sorted({item.kind for item in oracle.integrity} & UNREAD_REWARD)
    if unread:
        return "broken", (
            f"the oracle's reward file does not say what the task declares ({', '.join(unread)}): {oracle.error}; "
            "name the reward's key (reward_key) or its range (reward_range)"
        )
    if oracle.reward != 1.0:
        problem = f" ({oracle.error})" if oracle.error else ""
        return "broken", f"the oracle reaches reward {oracle.reward}, not 1.0{problem}: the task is unsolvable"
    if nothing.reward is not None and nothing.reward >= 1.0:
        return "broken", "doing nothing already scores 1.0: the task rewards no work"
    return "ok", "the oracle solves the task and doing nothing does not"


def mutants_to_drop(request: RolloutRequest, oracle: RolloutResult) -> list[str]:
    """The expected ids whose mutant tripwire the oracle run says is wrong for this task: the oracle passed a test and
    its mutant (the test passes with two expected values), or it failed a test that has one (run beside its mutant,
    the test fails: it reads state another test left)."""
    if request.tests is None:
        return []
    passed_twice = [
        finding.path.split(MUTANT_PASSED, 1)[0]
        for finding in oracle.integrity
        if finding.kind == "report_forged" and MUTANT_PASSED in finding.path
    ]
    failed = [test.test_id for test in oracle.test_outcomes if test.outcome != "passed"]
    known = {*request.tests.fail_to_pass, *request.tests.pass_to_pass} - set(request.tests.unmutated)
    return [test_id for test_id in dict.fromkeys([*passed_twice, *failed]) if test_id in known]


def without_mutants(request: RolloutRequest, test_ids: list[str]) -> RolloutRequest:
    if request.tests is None:
        return request
    tests = request.tests.model_copy(update={"unmutated": [*request.tests.unmutated, *test_ids]})
    return request.model_copy(update={"tests": tests})


def judge_without_oracle(nothing: RolloutResult) -> tuple[Verdict, str]:
    """The verdict on a task that has no solution, from its do-nothing run: never ok, since nothing shows that it
    can be solved."""
    if is_infrastructure_failure(nothing.status):
        return "inconclusive", f"the do-nothing run failed on our side ({nothing.status}): {nothing.error}"
    if nothing.verify_network_failure is not None:
        return (
            "inconclusive",
            f"the do-nothing run's verify failed to reach the network: {nothing.verify_network_failure}",
        )
    if nothing.reward is not None and nothing.reward >= 1.0:
        return "broken", "doing nothing already scores 1.0: the task rewards no work"
    return "inconclusive", (
        f"the task has no solution, so whether it can be solved is unknown; its image runs and doing nothing scores "
        f"{nothing.reward}"
    )


async def check_task(request: RolloutRequest, backend: SandboxBackend) -> TaskCheck:
    """Run the oracle and the do-nothing agent side by side on `backend`; a request with no solution gets the
    do-nothing run alone. A task graded by tests gets a second oracle run (a mutant runs before or after its original
    at random, so a test that reads state another left fails beside its mutant in half the runs); when either says a
    mutant tripwire is wrong for a test, the oracle runs again without those mutants, and a warning names the ids to
    add to `tests.unmutated`. A task graded by tests also gets an oracle run in the other test mode (by value when it
    resolves to in process, and the reverse): the report says which the task supports and which to declare."""
    if request.solution is None:
        nothing = await run_rollout(request.doing_nothing(), backend)
        verdict, reason = judge_without_oracle(nothing)
        return TaskCheck(None, nothing, verdict, reason, tuple(task_warnings(request)))
    oracles = 2 if request.tests is not None else 1
    choice = choose_mode(request.tests) if request.tests is not None else None
    other_request = other_mode(request, choice)
    oracle, nothing, *more = await asyncio.gather(
        run_rollout(request, backend),
        run_rollout(request.doing_nothing(), backend),
        *(run_rollout(request, backend) for _ in range(oracles - 1)),
        *([run_rollout(other_request, backend)] if other_request is not None else []),
    )
    other_run = more.pop() if other_request is not None else None
    warnings = task_warnings(request)
    dropped = list(dict.fromkeys(test_id for run in (oracle, *more) for test_id in mutants_to_drop(request, run)))
    if dropped:
        again = await run_rollout(without_mutants(request, dropped), backend)
        if again.reward == 1.0:
            oracle = again
            warnings.append(
                f"the oracle passes only without the mutant tripwire of {', '.join(dropped)}: add "
                f"{json.dumps(dropped)} to tests.unmutated (those tests are then guarded by the constant canaries only)"
            )
    verdict, reason = judge(oracle, nothing)
    if choice is not None and other_run is not None:
        verdict, reason, advice = judge_modes(choice, oracle, other_run, verdict, reason)
        warnings += advice
    return TaskCheck(oracle, nothing, verdict, reason, tuple(warnings), other_run, choice)


MODE_FIELD = "tests.mode ([verifier.tests] mode in a Harbor task)"


def judge_modes(
    choice: ModeChoice, oracle: RolloutResult, other: RolloutResult, verdict: Verdict, reason: str
) -> tuple[Verdict, str, list[str]]:
    """The verdict and advice once the oracle ran in both test modes: a task whose own mode fails its oracle while
    the other passes is broken, naming the declaration that fixes it; a task that resolves to in process while its
    oracle passes by value is told to declare by_value."""
    passes, other_passes = oracle.reward == 1.0, other.reward == 1.0
    other_name = "in_process" if choice.mode == "by_value" else "by_value"
    if not passes and other_passes:
        how = "auto chose it" if not choice.declared else "as declared"
        return (
            "broken",
            (
                f"the oracle reaches {oracle.reward} {choice.mode.replace('_', ' ')} ({how}: {choice.reason}) and 1.0 "
                f"{other_name.replace('_', ' ')}: declare {MODE_FIELD} = {other_name!r}"
            ),
            [],
        )
    if choice.mode == "in_process" and passes and other_passes:
        return (
            verdict,
            reason,
            [
                f"the oracle also reaches 1.0 by value ({choice.reason}): declare {MODE_FIELD} = 'by_value', so "
                "the code under test runs in its own process and reaches the tests only through values"
            ],
        )
    if choice.mode == "by_value" and passes and not other_passes:
        return (
            verdict,
            reason,
            [
                f"the oracle reaches 1.0 by value but {other.reward} in process: declare {MODE_FIELD} = 'by_value' "
                "explicitly if the tests are meant to be graded only that way"
            ],
        )
    return verdict, reason, []


def other_mode(request: RolloutRequest, choice: ModeChoice | None) -> RolloutRequest | None:
    """The request graded in the test mode its own does not resolve to (None without a test grader)."""
    if request.tests is None or choice is None:
        return None
    other = "in_process" if choice.mode == "by_value" else "by_value"
    return request.model_copy(update={"tests": request.tests.model_copy(update={"mode": other})})
