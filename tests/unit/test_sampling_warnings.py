"""Sampling warnings: what a trainer is told about logprobs that may not be those of the distribution that sampled,
and only where it applies (a rollout that sampled; the raw-logprobs caveat only where the server's kind is unknown)."""

from __future__ import annotations

import pytest

from opencode_env.rollout.sampling import sampling_notices
from opencode_env.training.sequences import training_summary
from opencode_env.wire import RolloutRequest, RolloutResult, Sampling


def sampling_warnings(task: RolloutRequest | None, *, sampled: bool = True, kind: str | None = None) -> list[str]:
    return [notice.message for notice in sampling_notices(task, sampled=sampled, logprobs_kind=kind)]


def request(sampling: Sampling | None = None, **fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate({"instruction": "add two numbers", "sampling": sampling, **fields})


def test_a_result_without_its_request_gets_no_warning() -> None:
    assert sampling_warnings(None) == []


def test_no_sampling_says_the_server_defaults_decided_unrecorded() -> None:
    [notice] = sampling_notices(request(), sampled=True)
    assert "model server's defaults decided the sampling, unrecorded" in notice.message
    assert "generation_config" in notice.message
    assert (notice.code, notice.severity) == ("sampling_unrecorded", "warning")
    assert "temperature=1.0" in notice.fix


@pytest.mark.parametrize(
    "sampling", [None, Sampling(top_p=0.9), Sampling(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0)]
)
def test_a_rollout_that_never_sampled_gets_no_sampling_warning(sampling: Sampling | None) -> None:
    """Refused at validation, cut before the agent's first call: nothing was sampled, so nothing to doubt."""
    assert sampling_warnings(request(sampling), sampled=False) == []
    assert sampling_warnings(request(sampling), sampled=True) != []


def test_the_raw_logprobs_caveat_applies_only_where_the_server_s_kind_is_unknown() -> None:
    shaped = request(Sampling(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0))
    assert any("not neutral" in warning for warning in sampling_warnings(shaped, kind=None))
    assert not any("not neutral" in warning for warning in sampling_warnings(shaped, kind="processed"))
    assert not any("not neutral" in warning for warning in sampling_warnings(shaped, kind="raw"))  # the probe's own


def test_neutral_sampling_gets_no_warning() -> None:
    neutral = Sampling(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        min_p=0.0,
        seed=7,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        stop=["</done>"],
    )
    assert sampling_warnings(request(neutral)) == []


def test_fields_left_unset_are_named_as_the_server_s_defaults() -> None:
    [warning] = sampling_warnings(request(Sampling(temperature=1.0, top_k=0)))
    assert warning.startswith("sampling fields left unset (top_p, min_p) are the model server's defaults")


def test_non_neutral_sampling_names_its_fields_and_the_vllm_flag() -> None:
    [warning] = sampling_warnings(request(Sampling(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0, seed=1)))
    assert "temperature=0.6, top_p=0.95, top_k=20)" in warning
    assert "min_p" not in warning
    assert "seed" not in warning
    assert "raw_logprobs" in warning
    assert "--logprobs-mode processed_logprobs" in warning


def test_each_non_neutral_field_is_named() -> None:
    cases = {
        "min_p=0.05": Sampling(min_p=0.05),
        "repetition_penalty=1.1": Sampling(repetition_penalty=1.1),
        "presence_penalty=0.5": Sampling(presence_penalty=0.5),
        "frequency_penalty=-0.2": Sampling(frequency_penalty=-0.2),
        "temperature=0.0": Sampling(temperature=0.0),
    }
    for named, sampling in cases.items():
        *_, warning = sampling_warnings(request(sampling))
        assert f"({named})" in warning, (named, warning)


def test_runs_that_record_no_logprobs_get_no_warning() -> None:
    assert sampling_warnings(request(mode="black_box")) == []
    assert sampling_warnings(request(solution=["echo solved"])) == []


def test_the_training_summary_shows_the_warnings_of_the_result() -> None:
    task = request(Sampling(top_p=0.9))
    result = RolloutResult(task=task)
    for notice in sampling_notices(task, sampled=True):
        result.warn(notice.code, notice.message, severity=notice.severity, fix=notice.fix)
    text = training_summary(result).text()
    assert "warning:    sampling is not neutral (top_p=0.9)" in text
    assert "warning:    sampling fields left unset (temperature, top_k, min_p)" in text
