"""A request's `artifacts`, collected from the agent's box after verify: the files of the task's roots it names,
bounded in size and count, and never through a link (to the sandbox's system files or the host's)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from opencode_env.rollout.collect import MAX_ARTIFACT_FILES
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.wire import RolloutRequest

LEAVES = f"""\
mkdir -p /srv/out/sub /srv/many
echo hi > /srv/out/a.txt
echo deep > /srv/out/sub/b.txt
printf 'x\\000y' > /srv/out/bin.dat
head -c 2000000 /dev/zero | tr '\\0' a > /srv/out/big.txt
ln -s /etc/passwd /srv/out/passwd-link
ln -s /run/opencode-env/host/etc /srv/host-link
ln -s /etc /srv/etc-link
for i in $(seq {MAX_ARTIFACT_FILES + 20}); do echo "$i" > /srv/many/$i.txt; done
echo 42 > /app/answer.txt
"""


@pytest.mark.timeout(600)
async def test_artifacts_are_bounded_and_follow_no_link(backend: LocalBackend) -> None:
    request = RolloutRequest(
        instruction="x",
        image=build_base_image(),
        workdir="/app",
        solution=[LEAVES],
        solution_as="root",
        verify=["true"],
        artifacts=["/srv/out", "/app/answer.txt", "/srv/out/passwd-link", "/srv/host-link", "/srv/etc-link",
                   "/srv/missing", "/srv/many"],
    )  # fmt: skip
    result = await run_rollout(request, backend)
    assert result.status == "completed", (result.error, result.solution_results)
    collected = result.artifacts
    assert {path: collected.get(path) for path in ("/srv/out/a.txt", "/srv/out/sub/b.txt", "/app/answer.txt")} == {
        "/srv/out/a.txt": "hi\n",
        "/srv/out/sub/b.txt": "deep\n",
        "/app/answer.txt": "42\n",
    }
    assert all(path.startswith(("/srv/out/", "/srv/many/", "/app/")) for path in collected), sorted(collected)
    assert not any("root:" in text for text in collected.values()), "no link was followed"
    assert len(collected) == MAX_ARTIFACT_FILES
    why = dict(line.split(": ", 1) for line in result.artifacts_extra)
    assert why["/srv/out/bin.dat"] == "binary"
    assert why["/srv/out/big.txt"].startswith("over the caps")
    for linked in ("/srv/out/passwd-link", "/srv/host-link", "/srv/etc-link", "/srv/missing"):
        assert why[linked].startswith("absent"), (linked, why)
    assert sum(1 for path in why if path.startswith("/srv/many/")) >= 1, "the count cap is said"


@pytest.mark.parametrize(
    "path", ["relative/x", "/etc/passwd", "/home/user/.config/opencode", "/app/../etc", "/proc/1/environ", "/"]
)
def test_an_artifact_outside_the_tasks_roots_is_refused_by_name(path: str) -> None:
    with pytest.raises(ValidationError, match="artifacts"):
        RolloutRequest(instruction="x", artifacts=[path])
