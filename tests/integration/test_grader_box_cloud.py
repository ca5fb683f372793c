"""The grader's box on the cloud backends (over the fakes, which run each SDK call in a local sandbox): a second VM,
into which root's walker in the agent's VM packs the work dir's regular files and root's walker in the new VM
unpacks them. An oracle run plays the agent: a wrong add.py plus a link to a right one, a FIFO, an upper-case
dist-info and a .pth gets 0.0 with a finding for each; the honest add.py gets 1.0."""

from __future__ import annotations

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.testing.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FakeHfCloud
from opencode_env.wire import RolloutRequest
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
    honest = await run_rollout(request(f"{RIGHT} > add.py"), backend)
    assert (honest.status, honest.reward, honest.grade_isolation) == ("completed", 1.0, "fresh_box"), honest.error
    assert honest.integrity == []
