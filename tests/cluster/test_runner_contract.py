"""The runner seam's contract (tests/runner_contract.py) over `RayRollouts` on the tier's simulated cluster: the same
checks the in-process runner and a server pass (tests/contract/test_runners.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.cluster import RayRollouts
from tests import runner_contract as contract

pytestmark = pytest.mark.timeout(900)


def test_capabilities(rollouts: RayRollouts) -> None:
    contract.check_capabilities(rollouts, "cluster")


async def test_run_one(rollouts: RayRollouts) -> None:
    await contract.check_run_one(rollouts)


async def test_partial(rollouts: RayRollouts) -> None:
    await contract.check_partial(rollouts)


async def test_run_many_in_request_order(rollouts: RayRollouts) -> None:
    await contract.check_run_many_in_request_order(rollouts)


async def test_a_failure_is_a_result(rollouts: RayRollouts) -> None:
    await contract.check_a_failure_is_a_result(rollouts)


async def test_eval(rollouts: RayRollouts, tmp_path: Path) -> None:
    await contract.check_eval(rollouts, tmp_path / "eval")


async def test_audit(rollouts: RayRollouts, tmp_path: Path) -> None:
    await contract.check_audit(rollouts, tmp_path / "audit")


async def test_rollout_func(rollouts: RayRollouts) -> None:
    contract.check_rollout_func(rollouts)


async def test_one_driver_serves_evals_one_after_another_without_starting_again(
    rollouts: RayRollouts, tmp_path: Path
) -> None:
    before = {report.node_id: report.pid for report in await rollouts.nodes()}
    await contract.check_eval(rollouts, tmp_path / "first")
    await contract.check_eval(rollouts, tmp_path / "second")
    assert {report.node_id: report.pid for report in await rollouts.nodes()} == before
