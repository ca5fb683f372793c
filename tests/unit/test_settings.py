"""One place for settings: every operator variable the code reads is declared in opencode_env/settings.py, the
docs' settings table is made from it (tests/test_docs.py), a bad value is refused by name, and `opencode-env
settings` never shows a secret."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_env.rollout.opencode import MODEL_KEY_ENV_NAME
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import PROXY_TOKEN_ENV_NAME
from opencode_env.settings import (
    OURS_FOR_OUR_PROCESSES,
    OURS_FOR_TESTS,
    Settings,
    markdown_table,
    unknown_variables,
    variable,
    variable_names,
)
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutRequest

ROOT = Path(__file__).resolve().parents[2]


def test_every_operator_variable_the_code_names_is_declared() -> None:
    named: set[str] = set()
    for path in [*ROOT.glob("opencode_env/**/*.py"), *ROOT.glob("server/*.py")]:
        named |= set(re.findall(r"\"(OPENCODE_ENV_[A-Z0-9_]+)\"", path.read_text()))
    undeclared = sorted(named - OURS_FOR_OUR_PROCESSES - OURS_FOR_TESTS - set(variable_names()))
    assert undeclared == []


def _code() -> list[tuple[Path, str]]:
    return [(path, path.read_text()) for path in [*ROOT.glob("opencode_env/**/*.py"), *ROOT.glob("server/*.py")]]


def test_an_operator_variable_is_named_one_way_through_the_settings() -> None:
    """No module keeps its own constant for a setting's name: `variable(field)` is the one way, and each field it is
    asked for exists (a typo would otherwise surface only when the message naming it is written)."""
    constants = [
        f"{path.relative_to(ROOT)}: {found}"
        for path, text in _code()
        for found in re.findall(r"^\w+_VAR = .*$", text, flags=re.M)
    ]
    asked = {name for _, text in _code() for name in re.findall(r"\bvariable\(['\"](\w+)['\"]\)", text)}
    assert constants == []
    assert asked, "the code names its settings through variable()"
    assert sorted(asked - set(Settings.model_fields)) == []


def test_each_variable_is_declared_once_and_listed_once_on_the_settings_page() -> None:
    names = variable_names()
    assert len(names) == len(set(names))
    rows = [line for line in markdown_table().splitlines() if line.startswith("| `")]
    assert sorted(row.split("`")[1] for row in rows) == sorted(names)


def test_the_variables_we_set_for_our_own_processes_are_not_settings_and_never_warned_about() -> None:
    ours = {MODEL_KEY_ENV_NAME, PROXY_TOKEN_ENV_NAME, "OPENCODE_ENV_TEMPLATE_FORMAT"}
    assert ours <= OURS_FOR_OUR_PROCESSES
    assert ours.isdisjoint(variable_names())
    assert unknown_variables(dict.fromkeys(ours, "x")) == []
    misspelled = {"OPENCODE_ENV_UPSTREAM_ALOW": "x", "OPENCODE_ENV_RESULT_DIR": "x", "OPENCODE_ENV_HF_SANDBOX": "1"}
    assert unknown_variables(misspelled) == [
        ("OPENCODE_ENV_HF_SANDBOX", variable("hf_sandboxes")),
        ("OPENCODE_ENV_RESULT_DIR", variable("results_dir")),
        ("OPENCODE_ENV_UPSTREAM_ALOW", variable("upstream_allow")),
    ]


HOST_VIEW_READS = "trust_settings(os.environ)"
"""All that sandbox/ reads of this process's environment: the host's CA-bundle variables, which a local sandbox is
given as the host has them (not settings)."""


def test_no_backend_reads_an_operator_setting_from_the_environment() -> None:
    """Backends get their settings through their constructors, from the registry; only the registry loads them, for a
    caller that passes none."""
    reads, loads = [], []
    for path in ROOT.glob("opencode_env/sandbox/**/*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            if re.search(r"\bos\.(environ|getenv)\b|\bgetenv\(|import environ\b", line.replace(HOST_VIEW_READS, "")):
                reads.append(where)
            if "Settings.load(" in line and path.name != "registry.py":
                loads.append(where)
    assert (reads, loads) == ([], [])


@pytest.mark.parametrize(
    ("name", "value"),
    [("PORT", "eighty"), ("OPENCODE_ENV_MEMORY_OVERCOMMIT", "0"), ("OPENCODE_ENV_BACKEND", "locl")],
)
def test_a_bad_value_is_refused_with_its_name(name: str, value: str) -> None:
    with pytest.raises(ValidationError, match=name):
        Settings.load({name: value})


def test_values_come_from_the_environment_given() -> None:
    loaded = Settings.load({"PORT": "9001", "OPENCODE_ENV_HF_SANDBOXES": "1", "UNRELATED": "x"})
    assert (loaded.port, loaded.hf_sandboxes, loaded.backend) == (9001, True, "auto")


async def test_a_rollout_under_a_refused_setting_ends_as_invalid_request_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENCODE_ENV_MAX_CPUS", "many")
    backend = StubBackend()
    request = RolloutRequest(instruction="x", base_url="http://127.0.0.1:9/v1", model="m")
    result = await run_rollout(request, backend)
    assert (result.status, result.failed_phase) == ("invalid_request", "validate")
    assert "OPENCODE_ENV_MAX_CPUS" in (result.error or "")
    assert backend.alive == set()
    assert result.sandbox_id == ""
