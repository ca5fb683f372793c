"""A typo'd field says which field was meant, wherever a request is validated (the client, the CLI, eval's files,
the server): pydantic's own "Extra inputs are not permitted" named no field to use instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from opencode_env.cli import main
from opencode_env.wire import RolloutRequest, Sampling, request_problems
from opencode_env.wire.suggest import closest


def typos(name: str) -> set[str]:
    """Each one-letter deletion, '-' for '_', and the name in capitals."""
    return {name[:index] + name[index + 1 :] for index in range(len(name))} | {name.replace("_", "-"), name.upper()}


@pytest.mark.parametrize("model", [RolloutRequest, Sampling])
def test_every_field_misspelt_by_a_letter_is_suggested(model: type[BaseModel]) -> None:
    names = list(model.model_fields)
    missed = [(name, typo) for name in names for typo in typos(name) - set(names) if name not in closest(typo, names)]
    assert missed == []


def test_the_request_s_error_names_the_unknown_field_and_the_known_ones_nearest() -> None:
    with pytest.raises(ValidationError) as refused:
        RolloutRequest.model_validate(
            {"instruction": "x", "timeout_secs": 300, "sampling": {"temprature": 1.0}, "token_in": "no", "zzz": 1}
        )
    problems = request_problems(refused.value)
    assert "timeout_secs: unknown field timeout_secs (did you mean total_timeout_s, setup_timeout_s or " in problems
    assert "sampling.temprature: unknown field temprature (did you mean temperature?)" in problems
    assert "zzz: unknown field zzz;" in problems + ";"
    assert "token_in: Input should be 'off', 'auto' or 'require'" in problems  # other errors as they were
    assert [item["type"] for item in refused.value.errors()].count("extra_forbidden") == 3


def test_a_request_without_unknown_fields_fails_as_before() -> None:
    with pytest.raises(ValidationError) as refused:
        RolloutRequest.model_validate({"instruction": "x", "env": {"PATH": "/x"}})
    assert "env: PATH reserved" in request_problems(refused.value)


def test_a_request_file_s_unknown_key_is_named_with_the_one_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"instruction": "x", "base_url": "http://127.0.0.1:9/v1", "modle": "m"}))
    assert main(["run", "--request", str(request)]) == 2
    error = capsys.readouterr().err
    assert "opencode-env: invalid request: modle: unknown field modle (did you mean mode or model?)" in error
