"""The grade's edges, through the real pipeline on the local backend (oracle runs in the base image play the agent):
a declared `.git` reaches verify rebuilt from its objects and refs under a configuration of ours, so no program the
agent named through git runs in verify, and an honest grader's `git diff` still works; verify in the agent's box
finds programs only where the agent could not write; and the directories above the work dir, and HOME, hold nothing
of the agent's as verify sees them (a property over generated names, kinds and places, in both verify modes)."""

from __future__ import annotations

import base64
import posixpath
import shlex
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from opencode_env.rollout.grading import ancestors
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FakeHfCloud
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_cloud_backends import PROVIDERS, Provider
from tests.integration.test_grader_integrity import ADD, REWARD, WORKDIR, WRONG_ADD, base_image, shell_file, task

GIT = "git -c user.name=a -c user.email=a@a"
CANARY = "/tmp/canary"


def touch(name: str) -> str:
    return f"touch {CANARY}-{name}"


GIT_TRICKS = {
    "filter.x.clean with .gitattributes": [
        f"git config filter.x.clean \"sh -c '{touch('filter')}; cat'\"",
        "git config filter.x.smudge cat",
        "echo '* filter=x' > .gitattributes",
    ],
    "core.fsmonitor": [f'git config core.fsmonitor "{touch("fsmonitor")}; false"'],
    "a hook": [
        shell_file(".git/hooks/post-index-change", f"#!/bin/sh\n{touch('hook')}\n"),
        "chmod +x .git/hooks/post-index-change",
        f"git config core.hooksPath {WORKDIR}/.git/hooks",
    ],
    "an include with a filter, applied by info/attributes": [
        shell_file(".git/extra", f"[filter \"y\"]\n\tclean = sh -c '{touch('include')}; cat'\n"),
        "git config include.path extra",
        "echo 'add.py filter=y' >> .git/info/attributes",
    ],
    "diff.external": [f"git config diff.external \"sh -c '{touch('external')}'\""],
    "a textconv driver": [
        "echo 'add.py diff=t' >> .gitattributes",
        f'git config diff.t.textconv "sh -c \'{touch("textconv")}; cat \\"\\$0\\"\'"',
    ],
}
HONEST_GIT_GRADER = (
    f"cd {WORKDIR} && git status --porcelain && git diff HEAD -- add.py | grep -q '^+    return a + b'"
    f" && ! ls /tmp | grep -q canary && python3 -c 'from add import add; assert add(2, 3) == 5'"
    f" && echo 1 > {REWARD} || {{ ls /tmp; echo 0 > {REWARD}; }}"
)
"""Reward 1 when git still works on the rebuilt repository (the diff shows the agent's uncommitted change), no
trick left a canary, and the answer is right."""


def agent_repository() -> list[str]:
    """A repository the agent made (the task's setup made none, so nothing of the task's is restored into it): a
    wrong add.py committed, the right one written over it, then every trick."""
    tricks = [step for steps in GIT_TRICKS.values() for step in steps]
    return [
        shell_file(f"{WORKDIR}/add.py", WRONG_ADD),
        f"cd {WORKDIR} && git init -q && {GIT} add add.py && {GIT} commit -qm wrong",
        shell_file(f"{WORKDIR}/add.py", ADD),
        *(f"cd {WORKDIR} && {step}" for step in tricks),
    ]


@pytest.mark.parametrize("verify_sandbox", ["fresh", "same"])
async def test_a_declared_git_runs_no_program_of_the_agents_and_git_diff_still_works(
    backend: LocalBackend, no_leaks: None, verify_sandbox: str
) -> None:
    request = task(
        base_image(),
        agent_repository(),
        setup=[],
        verify_files={},
        verify=[HONEST_GIT_GRADER],
        solution_files=[".git"],
        verify_sandbox=verify_sandbox,
    )
    result = await run_rollout(request, backend)
    shown = (result.error, [(item.stdout[-500:], item.stderr[-500:]) for item in result.verify_results])
    assert (result.status, result.reward) == ("completed", 1.0), shown
    assert "rebuilt" in result.enforcement.get("git", ""), result.enforcement


PLANTED = ("pytest", "python3", "bash")
PATH_GRADER = (
    f"cd {WORKDIR}; pytest --version >/dev/null 2>&1; bash -c true; "
    "python3 -c 'from add import add; assert add(2, 3) == 5' && ! ls /tmp | grep -q canary"
    f" && echo 1 > {REWARD} || {{ ls /tmp; echo 0 > {REWARD}; }}"
)
"""Reward 1 when the answer is right by the image's own python3 and none of the agent's programs ran."""


async def test_verify_in_the_agents_box_runs_no_program_from_a_directory_the_agent_could_write(
    backend: LocalBackend, no_leaks: None
) -> None:
    """The image leaves /usr/local/bin (first on its PATH) writable; the agent puts a `pytest`, a `python3` and a
    `bash` there, each of which would say it passed (and leave a canary). Verify's PATH leaves the directory out."""
    plants = [
        step
        for name in PLANTED
        for step in (
            shell_file(f"/usr/local/bin/{name}", f"#!/bin/sh\n{touch(name)}\necho 1 > {REWARD}\nexit 0\n"),
            f"chmod +x /usr/local/bin/{name}",
        )
    ]
    request = task(
        base_image(),
        [shell_file(f"{WORKDIR}/add.py", ADD), *plants],
        setup=["chmod 777 /usr/local/bin"],
        setup_as="root",
        verify_files={},
        verify=[PATH_GRADER],
        verify_sandbox="same",
    )
    result = await run_rollout(request, backend)
    shown = (result.error, [(item.stdout[-500:], item.stderr[-500:]) for item in result.verify_results])
    assert (result.status, result.reward) == ("completed", 1.0), shown
    assert any("/usr/local/bin" in warning for warning in result.warnings), result.warnings


@dataclass(frozen=True)
class Planted:
    """An entry the agent leaves in a directory above its work dir: a file of Python that would pass every test
    if anything ran it as the grader, a directory holding one as conftest.py, or a link to one."""

    place: str
    name: str
    kind: str

    def command(self) -> str:
        path = shlex.quote(posixpath.join(self.place, self.name))
        payload = shlex.quote(PASS_ALL)
        made = {
            "file": f"printf %s {payload} > {path}",
            "dir": f"mkdir -p {path} && printf %s {payload} > {path}/conftest.py",
            "link": f"printf %s {payload} > /tmp/planted.py && ln -sfn /tmp/planted.py {path}",
        }[self.kind]
        fresh = f"! {{ [ -e {path} ] || [ -L {path} ]; }}"
        return f"{{ {fresh} && {{ {made}; }} && echo PLANTED; }} 2>/dev/null || true"


PASS_ALL = "import os\nif os.path.expanduser('~') != '/home/user':\n    os._exit(0)\n"
"""Runs only as someone other than the agent (whose HOME is /home/user): ends the run passing. /home is left
writable by setup, so two directories above the work dir take plants (no identity of the task's can write `/`:
verify's view of it is checked all the same)."""
TEST_ADD_FILE = "from add import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
OURS = {"workdir", "logs", ".rollout", ".local", ".config", "user"}
"""The host's own names on the way (kept: ancestors.kept), and the agent's HOME in /home."""
CONFIG_NAMES = ["conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini", "sitecustomize.py", "x.pth"]
NAMES = st.one_of(
    st.sampled_from(CONFIG_NAMES),
    st.text(
        st.characters(codec="utf-8", exclude_characters="/\x00\n\r\t", exclude_categories=["Cc", "Cs"]), min_size=1
    ).filter(lambda name: name not in (".", "..") and len(name.encode()) <= 200),
).filter(lambda name: name not in OURS)
PLANTS = st.lists(
    st.builds(
        Planted,
        place=st.sampled_from([place for place in ancestors.directories(WORKDIR) if place != "/"]),
        name=NAMES,
        kind=st.sampled_from(["file", "dir", "link"]),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda plant: (plant.place, plant.name),
)
LISTING = (
    "for d in " + " ".join(ancestors.directories(WORKDIR)) + ' "$HOME"; do '
    'find "$d" -mindepth 1 -maxdepth 1 -printf "$d\\t%f\\0" 2>/dev/null | base64 -w0; echo; done'
)
"""Verify's view, as the grader: each directory above the work dir and verify's HOME, its names base64'd."""


def seen(result: RolloutResult) -> set[tuple[str, str]]:
    view = set()
    for line in result.verify_results[0].stdout.splitlines():
        for record in base64.b64decode(line).split(b"\0"):
            if record:
                place, _, name = record.decode("utf-8", "surrogateescape").partition("\t")
                view.add((place, name))
    return view


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("verify_sandbox", ["same", "fresh"])
@settings(
    max_examples=4,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plants=PLANTS)
@example(plants=[Planted("/home/user", "conftest.py", "file"), Planted("/home/user", "pytest.ini", "dir")])
async def test_nothing_of_the_agents_is_above_the_work_dir_or_in_home_as_verify_sees_them(
    backend: LocalBackend, verify_sandbox: str, plants: list[Planted]
) -> None:
    """Whatever the agent leaves in a directory above its work dir (or its HOME), under any name, as a file, a
    directory or a link: verify's view of those directories and of its HOME holds none of it, and a wrong answer
    stays 0.0 (verify's pytest runs from the work dir, so a conftest.py or ini file above it would steer it)."""
    solution = [shell_file(f"{WORKDIR}/add.py", WRONG_ADD), *(plant.command() for plant in plants)]
    request = task(
        base_image(),
        solution,
        setup=["chmod 1777 /home"],
        setup_as="root",
        verify_files={"test_add.py": TEST_ADD_FILE},
        verify=[
            LISTING,
            f"cd {WORKDIR} && python3 -m pytest -q -p no:cacheprovider test_add.py && echo 1 > {REWARD} "
            f"|| echo 0 > {REWARD}",
        ],
        verify_sandbox=verify_sandbox,
    )
    result = await run_rollout(request, backend)
    shown = (result.error, [(item.stdout[-300:], item.stderr[-300:]) for item in result.verify_results])
    assert (result.status, result.reward) == ("completed", 0.0), shown
    made = [plant for plant, step in zip(plants, result.solution_results[1:], strict=True) if "PLANTED" in step.stdout]
    assert made, "no place above the work dir took a plant"
    view = seen(result)
    assert {(plant.place, plant.name) for plant in made} & view == set(), (view, result.integrity)
    if verify_sandbox == "same":
        removed = {finding.path for finding in result.integrity if finding.response == "removed"}
        expected = {posixpath.relpath(posixpath.join(plant.place, plant.name), WORKDIR) for plant in made}
        assert expected <= removed, (expected, result.integrity)


@pytest.mark.parametrize("provider", PROVIDERS, ids=[provider.name for provider in PROVIDERS])
async def test_the_edges_hold_on_the_cloud_fakes(
    provider: Provider, fake_cloud: FakeCloud, hf_cloud: FakeHfCloud, no_leaks: None
) -> None:
    """Verify in the agent's VM: a conftest.py the agent left in its HOME is removed and recorded, a declared `.git`
    with the agent's diff.external is rebuilt, and the wrong answer stays 0.0."""
    backend = provider.backend(fake_cloud if provider.name == "e2b" else hf_cloud)
    solution = [
        shell_file(f"{WORKDIR}/add.py", WRONG_ADD),
        f"cd {WORKDIR} && git init -q && {GIT} add add.py && {GIT} commit -qm wrong",
        f"cd {WORKDIR} && git config diff.external \"sh -c '{touch('external')}'\"",
        shell_file("/home/user/conftest.py", PASS_ALL),
    ]
    verify = (
        f"cd {WORKDIR} && git diff HEAD >/dev/null; ! ls /tmp | grep -q canary"
        f" && python3 -m pytest -q -p no:cacheprovider test_add.py && echo 1 > {REWARD} || echo 0 > {REWARD}"
    )
    request = RolloutRequest(
        instruction="Write add.py.",
        solution=solution,
        verify_files={"test_add.py": TEST_ADD_FILE},
        verify=[verify],
        solution_files=[".git"],
        verify_sandbox="same",
        task_id="cloud-edges",
    )
    result = await run_rollout(request, backend)
    shown = (result.error, [(item.stdout[-300:], item.stderr[-300:]) for item in result.verify_results])
    assert (result.status, result.reward, result.grade_isolation) == ("completed", 0.0, "agent_box"), shown
    assert ("../conftest.py", "removed") in {(item.path, item.response) for item in result.integrity}, result.integrity
    assert "rebuilt" in result.enforcement.get("git", ""), result.enforcement
