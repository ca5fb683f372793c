"""The backend registry: a name it does not know is refused with the known ones (never taken for another backend);
what the server asks of a built backend (its default concurrency, what stops it here) the backend answers itself,
and what the command line asks before one is built (what it needs, whether it can be reaped) the registry does."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest
from huggingface_hub import constants
from pydantic import ValidationError

from opencode_env.cli import build_parser
from opencode_env.sandbox import (
    AUTO,
    BACKENDS,
    EMBEDDED,
    BackendName,
    UnknownBackend,
    backend_names,
    default_backend,
    make_backend,
    reapable_names,
    resolve_backend_name,
)
from opencode_env.settings import Settings
from opencode_env.testing.stub_backend import StubBackend
from tests.server_app import runtime_for

KNOWN = ("auto", "local", "e2b", "hf")
PER_CPU = max(2, (os.cpu_count() or 2) * 2)


@pytest.mark.parametrize("call", [make_backend, resolve_backend_name])
def test_an_unknown_backend_name_is_refused_with_the_known_ones(call: Callable[[str, Settings], object]) -> None:
    with pytest.raises(UnknownBackend) as refused:
        call("locl", Settings())
    assert "'locl'" in str(refused.value)
    assert all(name in str(refused.value) for name in KNOWN)


def test_the_registry_holds_every_name_the_type_allows() -> None:
    assert {AUTO, *backend_names()} == set(get_args(BackendName)) == set(KNOWN)


@pytest.mark.parametrize("name", ["local", "e2b", "hf"])
def test_each_registered_name_builds_its_own_backend(name: str) -> None:
    assert make_backend(name).name == name


def test_a_caller_that_names_no_backend_gets_the_embedded_one() -> None:
    assert default_backend().name == EMBEDDED == "local"


@pytest.mark.parametrize(("name", "expected"), [("local", PER_CPU), ("e2b", 16), ("hf", PER_CPU)])
def test_the_server_caps_rollouts_at_the_backends_own_default(
    name: str, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MAX_CONCURRENT_ENVS", raising=False)
    monkeypatch.delenv("OPENCODE_ENV_BACKEND", raising=False)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    backend = make_backend(name)
    assert backend.capabilities.default_concurrency == expected
    assert runtime_for(backend).rollouts.limit == expected
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "3")
    assert runtime_for(backend).rollouts.limit == 3


def test_a_backend_outside_the_registry_gets_its_own_default() -> None:
    assert runtime_for(StubBackend()).rollouts.limit == StubBackend.capabilities.default_concurrency == PER_CPU


def test_what_stops_each_backend_here_is_answered_by_the_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    # Gone (CHANGELOG): it must not hide a missing bubblewrap.
    monkeypatch.setenv("OPENCODE_ENV_LOCAL_ISOLATION", "none")
    for variable in ("E2B_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    verdicts = {name: make_backend(name).preflight_verdict() for name in backend_names()}
    assert not any(verdict.proven for verdict in verdicts.values())
    assert "bubblewrap" in str(verdicts["local"].problem)
    assert "set E2B_API_KEY" in str(verdicts["e2b"].problem)
    assert "set HF_TOKEN" in str(verdicts["hf"].problem)
    keys = Settings.load({"E2B_API_KEY": "e2b-key", "HF_TOKEN": "hf-token"})
    assert [make_backend(name, keys).preflight_verdict().problem for name in ("e2b", "hf")] == [None, None]
    monkeypatch.setenv("E2B_API_KEY", "e2b-key")
    monkeypatch.setenv("HF_TOKEN", "hf-token")
    assert [make_backend(name).preflight_verdict().problem for name in ("e2b", "hf")] == [None, None]


def test_only_the_local_backend_enforces_a_rollouts_limits() -> None:
    assert [name for name in BACKENDS if make_backend(name).capabilities.enforces_limits] == ["local"]


def test_the_command_line_offers_the_registered_backends(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for name in backend_names():
        assert parser.parse_args(["run", "--backend", name, "--instruction", "x"]).backend == name
        assert parser.parse_args(["serve", "--backend", name]).backend == name
        if name not in reapable_names():
            with pytest.raises(SystemExit):
                parser.parse_args(["reap", "--backend", name])
    assert parser.parse_args(["serve"]).backend == AUTO
    assert parser.parse_args(["reap"]).backend in reapable_names()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--backend", "locl", "--instruction", "x"])
    assert "'locl'" in capsys.readouterr().err


def test_the_servers_settings_refuse_an_unknown_backend_name_naming_the_variable() -> None:
    with pytest.raises(ValidationError, match="OPENCODE_ENV_BACKEND"):
        Settings.load({"OPENCODE_ENV_BACKEND": "locl"})
