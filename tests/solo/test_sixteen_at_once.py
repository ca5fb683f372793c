"""Sixteen rollouts at once with random faults, over the local backend and E2B over the fake. It loads every core,
so `./dev test` runs this directory after the rest, alone: no test that waits on a real OpenCode's boot shares the
cores with it."""

from __future__ import annotations

import pytest

from opencode_env.sandbox.base import SandboxBackend
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.script import Script, bash, demo_script, fail, say
from tests.helpers import rollout, sleep_cmd

FAULTS: dict[str, tuple[Script, dict[str, object], str]] = {
    "none": (demo_script(), {}, "completed"),
    "upstream 400": (Script(steps=[fail(400)]), {}, "upstream_error"),
    "setup fails": (demo_script(), {"setup": ["exit 2"]}, "setup_failed"),
    "verify hangs": (demo_script(), {"verify": [sleep_cmd(300)], "verify_timeout_s": 2}, "completed"),
    "500 then fine": (Script(steps=[fail(500, retry_after_s=0.5), say("done")]), {"verify": []}, "completed"),
    # Tools run as another uid than OpenCode on every backend and cannot kill it (test_faults::test_opencode_crashes).
    "a tool kills OpenCode": (Script(steps=[bash("kill -9 $PPID")]), {}, "completed"),
}


@pytest.mark.timeout(600)
async def test_16_concurrent_rollouts_with_random_faults(
    backend: LocalBackend, e2b_fake: E2BBackend, no_leaks: None
) -> None:
    import asyncio
    import random

    chooser = random.Random(16)
    plan = [(chooser.choice(list(FAULTS)), chooser.choice([backend, e2b_fake])) for _ in range(16)]

    async def one(fault: str, chosen: SandboxBackend) -> tuple[str, str]:
        script, overrides, _ = FAULTS[fault]
        result = (await rollout(chosen, script, agent_timeout_s=240, **overrides)).result
        wanted = FAULTS[fault][2]
        return wanted, f"{result.status}" if result.status == wanted else f"{result.status} ({result.timings})"

    outcomes = await asyncio.gather(*(one(fault, chosen) for fault, chosen in plan))
    assert [status for _, status in outcomes] == [wanted for wanted, _ in outcomes], outcomes
    assert len({fault for fault, _ in plan}) >= 4
