"""The runner seam's contract (tests/runner_contract.py) over the in-process runner and a server (a real one on
loopback, on the same local backend); the Ray runner holds it in tests/cluster/test_runner_contract.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from opencode_env.client.client import OpenCodeEnv
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.wire import Runner, SandboxPlace
from tests import runner_contract as contract
from tests.server_app import app_for

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server_url(backend: LocalBackend) -> Iterator[str]:
    server = ThreadedServer(app_for(backend))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(params=["this_process", "server"])
async def runner(request: pytest.FixtureRequest, backend: LocalBackend) -> AsyncIterator[Runner]:
    made: Runner = (
        InProcess(backend) if request.param == "this_process" else OpenCodeEnv(request.getfixturevalue("server_url"))
    )
    yield made
    await made.close()


def test_capabilities(runner: Runner, request: pytest.FixtureRequest) -> None:
    place: SandboxPlace = request.node.callspec.params["runner"]
    contract.check_capabilities(runner, place)


async def test_run_one(runner: Runner, no_leaks: None) -> None:
    await contract.check_run_one(runner)


async def test_partial(runner: Runner, no_leaks: None) -> None:
    await contract.check_partial(runner)


async def test_run_many_in_request_order(runner: Runner, no_leaks: None) -> None:
    await contract.check_run_many_in_request_order(runner)


async def test_a_failure_is_a_result(runner: Runner, no_leaks: None) -> None:
    await contract.check_a_failure_is_a_result(runner)


async def test_eval(runner: Runner, tmp_path: Path, no_leaks: None) -> None:
    await contract.check_eval(runner, tmp_path / "eval")


async def test_rollout_func(runner: Runner, no_leaks: None) -> None:
    contract.check_rollout_func(runner)


async def test_audit(runner: Runner, tmp_path: Path, no_leaks: None) -> None:
    await contract.check_audit(runner, tmp_path / "audit")
