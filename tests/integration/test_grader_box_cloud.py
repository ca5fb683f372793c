"""The grader's box on the cloud backends (over the fakes, which run each SDK call in a local sandbox): a second VM,
opened when the agent ends (a VM bills while it waits), into which root's walker in the agent's VM packs the work dir's
regular files and root's walker in the new VM unpacks them. An oracle run plays the agent: a wrong add.py plus a link to
a right one, a FIFO, an upper-case dist-info and a .pth gets 0.0 with a finding for each; the honest add.py gets 1.0.
Under a tight deadline the agent's time leaves room for that VM's start and setup replay: verify runs whole, or the
rollout ends with no grade."""

from __future__ import annotations

import asyncio

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FakeHfCloud
from opencode_env.wire import INFRASTRUCTURE_FAILURES, RolloutRequest
from tests.integration.test_cloud_backends import PROVIDERS, Provider

RIGHT = "printf 'def add(a, b):\\n    return a + b\\n'"
TRICKS = (
    f"{RIGHT} > /tmp/add.py && ln -s /tmp/add.py add.py && mkfifo pipe && mkdir Evil.DIST-INFO "
    "&& printf '[pytest11]\\nzz = zz\\n' > Evil.DIST-INFO/entry_points.txt && echo 'import zz' > zz.pth"
)


def request(solution: str) -> RolloutRequest:
    return RolloutRequest(instruction=DEMO_INSTRUCTION, solution=[solution], verify=DEMO_VERIFY, task_id="cloud-box")


@pytest.mark.parametrize("provider", PROVIDERS, ids=[provider.name for provider in PROVIDERS])
async def test_the_grader_box_on_a_cloud_carries_regular_files_only(
    provider: Provider, fake_cloud: FakeCloud, hf_cloud: FakeHfCloud, no_leaks: None
) -> None:
    backend = provider.backend(fake_cloud if provider.name == "e2b" else hf_cloud)
    tricked = await run_rollout(request(TRICKS), backend)
    assert (tricked.status, tricked.reward, tricked.grade_isolation) == ("completed", 0.0, "fresh_box"), tricked.error
    found = {(item.path, item.kind) for item in tricked.integrity}
    expected = {
        ("add.py", "link"),
        ("pipe", "special_file"),
        ("Evil.DIST-INFO", "package_metadata"),
        ("zz.pth", "startup_hook"),
    }
    assert expected <= found, tricked.integrity
    cloud = fake_cloud if provider.name == "e2b" else hf_cloud
    seen: list[tuple[str, int]] = []
    created = cloud.created
    honest = await run_rollout(
        request(f"{RIGHT} > add.py"), backend, progress=lambda phase, _: seen.append((phase, len(cloud.alive)))
    )
    assert (honest.status, honest.reward, honest.grade_isolation) == ("completed", 1.0, "fresh_box"), honest.error
    assert honest.integrity == []
    assert cloud.created - created == 2
    alive_at_verify = next(alive for phase, alive in seen if phase == "verify")
    assert alive_at_verify == 1, "the grader's VM is opened when the agent ends, not beside it"


SLOW_SETUP_S = 12
SLOW_VERIFY = ["sleep 4; " + " && ".join(DEMO_VERIFY)]


def slow_grader_request(total_s: float) -> RolloutRequest:
    """Setup the grader's VM replays for 12 s, a verify that needs 5 s of its 6, and a right answer by an "agent"
    that then runs until it is stopped: without the grader VM's start in the agent's reserve, verify gets ~3 s."""
    return RolloutRequest(
        instruction=DEMO_INSTRUCTION,
        setup=[f"sleep {SLOW_SETUP_S}"],
        solution=[f"{RIGHT} > add.py", "sleep 1000"],
        verify=SLOW_VERIFY,
        verify_timeout_s=6,
        total_timeout_s=total_s,
        task_id="cloud-box-deadline",
    )


@pytest.mark.timeout(600)  # a rollout on the E2B fake and its grader's VM: 70 s at load 12
async def test_a_tight_deadline_leaves_verify_the_grader_vms_start_or_no_grade(
    e2b_fake: E2BBackend, no_leaks: None
) -> None:
    roomy, tight = await asyncio.gather(
        run_rollout(slow_grader_request(80), e2b_fake), run_rollout(slow_grader_request(40), e2b_fake)
    )
    assert (roomy.status, roomy.reward, roomy.grade_isolation) == ("agent_timeout", 1.0, "fresh_box"), roomy.error
    assert [result.timed_out for result in roomy.verify_results] == [False]
    assert not any(finding.kind == "verify_killed" for finding in roomy.integrity)
    assert tight.status in INFRASTRUCTURE_FAILURES, (tight.status, tight.error)
    assert (tight.reward, tight.failed_phase) == (None, "verify"), tight.error
