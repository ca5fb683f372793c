"""The pure rules of a multi-step rollout, over generated cases: min_reward (Harbor's: a missing reward or metric is
under any threshold), the steps' reward (mean over the graded steps, a missing metric 0 there; or the final graded
step's), and each step's request and the grader's box's replay."""

from __future__ import annotations

import math
import posixpath

from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from opencode_env.rollout.steps import replayed_request, step_request
from opencode_env.wire import RolloutRequest, RolloutResult, RolloutStep, StepResult
from opencode_env.wire.result import result_summary
from opencode_env.wire.steps import below_min_reward, combined

finite = st.floats(min_value=-10, max_value=10, allow_nan=False)
metric_names = st.sampled_from(["reward", "correctness", "style", "speed"])
metrics = st.dictionaries(metric_names.filter(lambda name: name != "reward"), finite, max_size=3)
thresholds = st.one_of(finite, st.dictionaries(metric_names, finite, min_size=1, max_size=3))


@given(thresholds, st.one_of(st.none(), finite), st.dictionaries(metric_names, finite, max_size=3))
def test_min_reward_stops_exactly_when_a_gated_value_is_under_or_missing(threshold, reward, got):
    """The `reward` gate reads the step's reward, never a metric that happens to be named `reward` (with a task's
    reward_key naming another metric, reward.json's own `reward` would otherwise lift the step over its gate)."""
    values = {**got, "reward": reward}
    gates = threshold if isinstance(threshold, dict) else {"reward": threshold}
    under = any(values.get(name) is None or values[name] < floor for name, floor in gates.items())
    why = below_min_reward(threshold, reward, got)
    assert (why is not None) == under
    if why is not None:
        assert "below the step's min_reward" in why


@given(st.text(alphabet="./-_aZ9\\\x00", max_size=6))
def test_a_step_name_is_always_one_directory_under_steps(name):
    """Whatever a task names a step, an accepted name is one directory directly under steps/ (never steps/ itself,
    its parent, or deeper)."""
    try:
        RolloutStep(name=name, instruction="x")
    except ValidationError:
        return
    assert posixpath.dirname(posixpath.normpath(f"steps/{name}")) == "steps", name


toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(), st.floats(), st.text(max_size=4), st.datetimes()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(metric_names, inner, max_size=3)),
    max_leaves=6,
)


@given(toml_values)
def test_a_min_reward_is_taken_only_as_the_numbers_written(value):
    """Whatever TOML or JSON puts in a step's min_reward, it is refused naming the field, or it is the numbers as
    written: no boolean read as 1.0, no string as the number it spells, nothing infinite."""
    try:
        step = RolloutStep(name="a", instruction="x", min_reward=value)
    except ValidationError as error:
        refusal = str(error)
    else:
        refusal = ""
    if refusal:
        assert "min_reward" in refusal
        return
    written = value if isinstance(value, dict) else {"": value}
    taken = step.min_reward if isinstance(step.min_reward, dict) else {"": step.min_reward}
    assert all(type(number) in (int, float) and math.isfinite(number) for number in written.values()), value
    assert taken == {name: float(number) for name, number in written.items()}


def test_no_min_reward_never_stops():
    assert below_min_reward(None, None, {}) is None


steps_graded = st.lists(
    st.builds(
        StepResult,
        name=st.sampled_from(["a", "b", "c"]),
        reward=st.one_of(st.none(), finite),
        reward_metrics=metrics,
    ),
    max_size=5,
)


@given(steps_graded)
def test_the_mean_is_over_graded_steps_and_final_is_the_last_graded(steps):
    graded = [step for step in steps if step.reward is not None]
    mean, mean_metrics = combined(steps, "mean")
    final, final_metrics = combined(steps, "final")
    if not graded:
        assert (mean, final, mean_metrics, final_metrics) == (None, None, {}, {})
        return
    assert mean is not None
    assert math.isclose(mean, sum(step.reward or 0.0 for step in graded) / len(graded), abs_tol=1e-9)
    assert (final, final_metrics) == (graded[-1].reward, graded[-1].reward_metrics)
    for key, value in mean_metrics.items():
        expected = sum(step.reward_metrics.get(key, 0.0) for step in graded) / len(graded)
        assert math.isclose(value, expected, abs_tol=1e-9)
    assert set(mean_metrics) == {key for step in graded for key in step.reward_metrics}


def _request() -> RolloutRequest:
    steps = [
        RolloutStep(
            name=name,
            instruction=f"do {name}",
            files={f"{name}.txt": name},
            setup=[f"setup {name}"],
            verify_files={"/tests/test.sh": f"test {name}"},
            solution=[f"solve {name}"],
            agent_timeout_s=10.0 if name == "b" else None,
        )
        for name in ("a", "b", "c")
    ]
    return RolloutRequest(
        instruction="shown",
        setup=["entrypoint"],
        files={"base.txt": "base"},
        verify=["bash /tests/test.sh"],
        verify_files={"/tests/lib.sh": "lib", "/tests/test.sh": "fallback"},
        agent_timeout_s=99.0,
        steps=steps,
        solution=[],
    )


def test_a_step_runs_its_own_setup_files_and_tests_over_the_tasks():
    request = _request()
    first, second = step_request(request, 0), step_request(request, 1)
    assert (first.setup, first.files) == (["entrypoint", "setup a"], {"base.txt": "base", "a.txt": "a"})
    assert (second.setup, second.files) == (["setup b"], {"b.txt": "b"}), "what ran before is not run again"
    assert second.verify_files == {"/tests/lib.sh": "lib", "/tests/test.sh": "test b"}
    assert (second.instruction, second.solution, second.steps) == ("do b", ["solve b"], [])
    assert (first.agent_timeout_s, second.agent_timeout_s) == (99.0, 10.0)
    assert step_request(request.model_copy(update={"solution": None}), 1).solution is None, "no oracle, no solution"


def test_the_grader_box_replays_every_step_so_far():
    replay = replayed_request(_request(), 2)
    assert replay.setup == ["entrypoint", "setup a", "setup b", "setup c"]
    assert replay.files == {"base.txt": "base", "a.txt": "a", "b.txt": "b", "c.txt": "c"}
    assert replay.verify_files["/tests/test.sh"] == "test c"


def test_a_result_with_steps_round_trips_as_standard_json():
    parts = [
        StepResult(name="a", status="completed", reward=1.0, min_reward={"c": 0.5}, first_turn=0, end_turn=3),
        StepResult(name="b", status="below_min_reward", reward=float("nan"), reward_metrics={"c": float("-inf")}),
        StepResult(name="c", status="not_run", error="not run: step b: reward nan is below"),
    ]
    result = RolloutResult(steps=parts)
    assert "steps:      a completed 1.0, b below_min_reward nan, c not_run None (mean)" in result_summary(result)
    text = result.model_dump_json()
    assert "NaN" in text
    assert RolloutResult.model_validate_json(text).model_dump_json() == text
