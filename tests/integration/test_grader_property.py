"""The grader's property: for any set of leftovers an agent adds beside its solution, the reward is the solution's
alone. Hypothesis draws the leftovers from a vocabulary of configuration that Python, pytest, pip, git, npm and
shells read (start-up hooks, `.pth`, conftest.py, ini files with addopts, `__init__.py`, `*.dist-info` in any case,
git's config, hooks, commondir and attributes, `.npmrc`, shell rc files, unchecked-hash bytecode of shadowed
modules), at any depth of the work dir, in HOME, the user site and /tmp, in any case, as links, with odd modes. Each
payload, if it ever ran as the grader, would show: it makes a wrong answer right, breaks the run, ends it with
status 0 or forces every outcome to pass (the canaries then flag the report). The real pipeline runs each example
(an oracle rollout in the base image, the test grader plus verify commands that run git and Python), with verify in
the agent's own box and in a fresh one.
"""

from __future__ import annotations

import base64
import importlib.util
import marshal
import posixpath
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from opencode_env.rollout.grading import integrity
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.wire import RolloutRequest
from tests.integration.test_grader_integrity import base_image

WORKDIR = "/home/user/workdir"
HOME = "/home/user"
ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
HELPER = "def check(add):\n    assert add(2, 3) == 5\n    assert add(-4, 1) == -3\n"
TEST_CALC = "from add import add\nfrom helper import check\n\n\ndef test_add():\n    check(add)\n"
TEST_ZERO = "from add import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
GRADED = {
    "files": {"test_calc.py": TEST_CALC, "test_zero.py": TEST_ZERO, "helper.py": HELPER},
    "fail_to_pass": ["test_calc.py::test_add"],
    "mode": "in_process",
    "pass_to_pass": ["test_zero.py::test_zero"],
}
VERIFY = [
    f"cd {WORKDIR} && git status >/dev/null 2>&1; git diff >/dev/null 2>&1; git log -1 >/dev/null 2>&1; true",
    f"cd {WORKDIR} && python3 -c 'import json' >/dev/null 2>&1; bash -c true; sh -c true; true",
]
"""Programs that read configuration, run as the grader before the tests (their exit codes do not count). None
imports a module of the agent's by name: that runs the agent's code by design (as the tests do the solution's)."""
GIT_SETUP = (
    f"cd {WORKDIR} && git init -q && git -c safe.directory='*' -c user.name=t -c user.email=t@t "
    "commit -q --allow-empty -m task && chown -R 1000:1000 ."
)
AS_GRADER = 'import os\nif os.path.expanduser("~") != "/home/user":\n'
"""Payloads act only when they run as someone other than the agent (its HOME is /home/user): the agent's own
commands (a `git add` running a filter) must not change its answer."""
RIGHT_COPY = f"{WORKDIR}/.right_add"
"""The right answer as data beside the solution: a payload that runs as the grader copies it over add.py."""
FIX_SHELL = f"[ $HOME = /home/user ] || cp {RIGHT_COPY} {WORKDIR}/add.py"
FORCE_PASS = """\
import _pytest.reports

_made = _pytest.reports.TestReport.from_item_and_call.__func__


def _passed(cls, item, call):
    report = _made(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_passed)
"""
PY_PAYLOADS = {
    "fix": f"open({WORKDIR + '/add.py'!r}, 'w').write(open({RIGHT_COPY!r}).read())\n",
    "exit0": "os._exit(0)\n",
    "break": "raise SystemExit('a leftover ran')\n",
    "force": f"exec({FORCE_PASS!r})\n",
}


def python_payload(kind: str) -> str:
    body = "".join(f"    {line}\n" for line in PY_PAYLOADS[kind].splitlines())
    return f"{AS_GRADER}{body}"


def pyc(source: str, name: str) -> bytes:
    """An unchecked-hash pyc (PEP 552): used whatever the source beside it says."""
    code = compile(source, name, "exec")
    return importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + bytes(8) + marshal.dumps(code)


@dataclass(frozen=True)
class Leftover:
    place: str
    """An absolute directory."""
    name: str
    """A path under it."""
    data: bytes
    mode: int | None = None
    link_to: str | None = None

    def command(self) -> str:
        path = posixpath.join(self.place, self.name)
        quoted = shlex.quote(path)
        parent = shlex.quote(posixpath.dirname(path))
        if self.link_to is not None:
            return f"mkdir -p {parent} && ln -sfn {shlex.quote(self.link_to)} {quoted}"
        encoded = base64.b64encode(self.data).decode()
        made = f"mkdir -p {parent} && rm -rf {quoted} && echo {encoded} | base64 -d > {quoted}"
        return made + (f" && chmod {self.mode:o} {quoted}" if self.mode is not None else "")


PLACES = st.sampled_from(
    [
        WORKDIR,
        f"{WORKDIR}/tests",
        f"{WORKDIR}/src/pkg",
        f"{WORKDIR}/a/b/c",
        HOME,
        f"{HOME}/.local/lib/python3.11/site-packages",
        f"{HOME}/logs",
        "/tmp",
    ]
)
PY_KINDS = st.sampled_from(sorted(PY_PAYLOADS))
PYTHON_NAMES = st.sampled_from(
    [
        "sitecustomize.py",
        "usercustomize.py",
        "conftest.py",
        "__init__.py",
        "helper.py",
        "test_calc.py",
        "test_zero.py",
        "zz_payload.py",
        "json.py",
        "pytest/__init__.py",
        "pytest/__main__.py",
        "_pytest/__init__.py",
        "pluggy/__init__.py",
        "tests/__init__.py",
        "tests/zzz/conftest.py",
    ]
)
INI = {
    "pytest.ini": "[pytest]\naddopts = {opts}\n",
    ".pytest.ini": "[pytest]\naddopts = {opts}\n",
    "tox.ini": "[pytest]\naddopts = {opts}\n",
    "setup.cfg": "[tool:pytest]\naddopts = {opts}\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '{opts}'\n",
}
ADDOPTS = st.sampled_from(["--co", "-p zz_payload", "-k nothing", "-x --deselect test_calc.py::test_add", "--lf"])
DIST_SUFFIXES = st.sampled_from([".dist-info", ".DIST-INFO", ".Dist-Info", ".egg-info", ".EGG-INFO"])
SHELL_NAMES = st.sampled_from([".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshrc", ".env", ".npmrc"])
GIT_FILES = {
    ".git/config": f'[core]\n\tfsmonitor = "{FIX_SHELL}; false"\n\thooksPath = .git/hooks\n'
    f'[filter "x"]\n\tclean = "{FIX_SHELL}; cat"\n[alias]\n\tstatus = "!{FIX_SHELL}"\n',
    ".gitattributes": "* filter=x diff=x\n",
    ".git/info/attributes": "* filter=x\n",
    ".git/hooks/post-checkout": f"#!/bin/sh\n{FIX_SHELL}\n",
    ".git/hooks/pre-commit": f"#!/bin/sh\n{FIX_SHELL}\n",
    ".git/hooks/fsmonitor-watchman": f"#!/bin/sh\n{FIX_SHELL}\n",
}
COMMONDIR = (
    f"cd {WORKDIR} && mkdir -p {HOME}/.common && cp -r .git/objects .git/refs {HOME}/.common/ "
    f'&& printf \'[filter "x"]\\n\\tclean = "%s; cat"\\n\' {shlex.quote(FIX_SHELL)} > {HOME}/.common/config '
    f"&& echo {HOME}/.common > .git/commondir && echo '* filter=x' > .gitattributes && git add -A; true"
)
"""Git reads its config from the directory `.git/commondir` names; the index then holds add.py, so a `git status`
whose stat check fails (the hand-over changes owners) runs the clean filter."""


def case_variants(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.upper(), name.title(), name.swapcase()])


@st.composite
def python_leftover(draw: st.DrawFn) -> Leftover:
    name = draw(PYTHON_NAMES)
    source = python_payload(draw(PY_KINDS))
    if name.startswith("test_calc"):
        source = f"__file__ = '/home/user/logs/verifier/tests/{name}'\n{source}\n\ndef test_add():\n    pass\n"
    return Leftover(draw(PLACES), name, source.encode(), draw(st.sampled_from([None, 0o755, 0o444, 0o000])))


@st.composite
def pth_leftover(draw: st.DrawFn) -> Leftover:
    line = "import zz_payload\n" if draw(st.booleans()) else "import os; exec(" + repr(python_payload("fix")) + ")\n"
    name = draw(case_variants("zz.pth"))
    return Leftover(draw(PLACES), name, line.encode())


@st.composite
def ini_leftover(draw: st.DrawFn) -> Leftover:
    name = draw(st.sampled_from(sorted(INI)))
    text = INI[name].format(opts=draw(ADDOPTS))
    return Leftover(draw(PLACES), draw(case_variants(name)), text.encode())


@st.composite
def dist_leftovers(draw: st.DrawFn) -> list[Leftover]:
    place = draw(PLACES)
    folder = draw(case_variants("zz_payload")) + draw(DIST_SUFFIXES)
    entry = "[pytest11]\nzz = zz_payload\n[console_scripts]\npytest = zz_payload:main\n"
    metadata = "Metadata-Version: 2.1\nName: zz-payload\nVersion: 1.0\n"
    return [
        Leftover(place, f"{folder}/entry_points.txt", entry.encode()),
        Leftover(place, f"{folder}/METADATA", metadata.encode()),
        Leftover(place, "zz_payload.py", python_payload(draw(PY_KINDS)).encode()),
    ]


@st.composite
def bytecode_leftover(draw: st.DrawFn) -> Leftover:
    module = draw(st.sampled_from(["helper", "test_calc", "add", "json", "conftest"]))
    tag = draw(st.sampled_from(["cpython-311", "cpython-311-pytest-7.2.1"]))
    source = "def check(add):\n    pass\n\n\ndef test_add():\n    pass\n\n\ndef add(a, b):\n    return a + b\n"
    folder = draw(st.sampled_from(["__pycache__", "tests/__pycache__"]))
    return Leftover(WORKDIR, f"{folder}/{module}.{tag}.pyc", pyc(source, f"{module}.py"))


@st.composite
def shell_leftover(draw: st.DrawFn) -> Leftover:
    name = draw(SHELL_NAMES)
    text = f"script-shell={WORKDIR}/zz.sh\n" if name == ".npmrc" else f"{FIX_SHELL}\n"
    return Leftover(draw(st.sampled_from([HOME, WORKDIR, "/tmp"])), name, text.encode())


@st.composite
def git_leftover(draw: st.DrawFn) -> Leftover:
    name = draw(st.sampled_from(sorted(GIT_FILES)))
    return Leftover(WORKDIR, name, GIT_FILES[name].encode(), 0o755 if "hooks" in name else None)


@st.composite
def link_leftover(draw: st.DrawFn) -> Leftover:
    name = draw(st.sampled_from(["conftest.py", "helper.py", "tests/zzz", "sitecustomize.py", "pytest.ini", "x.pth"]))
    target = draw(
        st.sampled_from(
            ["/home/user/logs/verifier", "/home/grader", "/", "..", "../..", "/tmp", f"{HOME}/.common", "/etc/passwd"]
        )
    )
    return Leftover(draw(st.sampled_from([WORKDIR, f"{WORKDIR}/tests", HOME])), name, b"", link_to=target)


ONE = st.one_of(
    python_leftover().map(lambda item: [item]),
    pth_leftover().map(lambda item: [item]),
    ini_leftover().map(lambda item: [item]),
    dist_leftovers(),
    bytecode_leftover().map(lambda item: [item]),
    shell_leftover().map(lambda item: [item]),
    git_leftover().map(lambda item: [item]),
    link_leftover().map(lambda item: [item]),
)
LEFTOVERS = st.lists(ONE, min_size=1, max_size=6).map(lambda groups: [item for group in groups for item in group])


def solution(answer: str, leftovers: list[Leftover], commondir: bool) -> list[str]:
    write = f"echo {base64.b64encode(answer.encode()).decode()} | base64 -d > {WORKDIR}/add.py"
    right = f"echo {base64.b64encode(ADD.encode()).decode()} | base64 -d > {RIGHT_COPY}"
    steps = [write, right, *(item.command() for item in leftovers)]
    if commondir:
        steps.append(COMMONDIR)
    return [*steps, f"touch {WORKDIR}/add.py; true"]


def request(image: str, steps: list[str], verify_sandbox: str) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "instruction": "Write add.py with add(a, b) returning a + b.",
            "image": image,
            "setup": [GIT_SETUP],
            "verify": VERIFY,
            "tests": GRADED,
            "solution": steps,
            "verify_sandbox": verify_sandbox,
            "task_id": "add-property",
        }
    )


@pytest.fixture(scope="module")
def image() -> str:
    return base_image()


EXAMPLES = 30
"""Per verify mode: 30 rollouts of 5-10 s each (about 4 minutes on a quiet 2-core machine, per mode)."""
ISSUE_ATTACKS = [
    [
        Leftover(WORKDIR, "Evil.DIST-INFO/entry_points.txt", b"[pytest11]\nzz = zz_payload\n"),
        Leftover(WORKDIR, "Evil.DIST-INFO/METADATA", b"Metadata-Version: 2.1\nName: evil\nVersion: 1\n"),
        Leftover(WORKDIR, "zz_payload.py", python_payload("force").encode()),
    ],
    [
        Leftover(HOME, "pytest.ini", b"[pytest]\naddopts = -p zz_payload\n"),
        Leftover(HOME, "conftest.py", python_payload("fix").encode()),
        Leftover(WORKDIR, "tests/__init__.py", python_payload("fix").encode()),
    ],
    [
        Leftover(WORKDIR, "helper.py", b"def check(add):\n    pass\n"),
        Leftover(WORKDIR, "test_calc.py", b"__file__ = '/home/user/logs/verifier/tests/test_calc.py'\n"),
    ],
]


async def no_put_back(*args: object, **kwargs: object) -> None:
    raise ValueError("the put-back layer is off in this test: the runner's isolation alone")


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("verify_sandbox", ["same", "same, no put-back", "fresh"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(leftovers=LEFTOVERS, right=st.booleans(), commondir=st.booleans())
@example(leftovers=ISSUE_ATTACKS[0], right=False, commondir=True)
@example(leftovers=ISSUE_ATTACKS[1], right=False, commondir=False)
@example(leftovers=ISSUE_ATTACKS[2], right=False, commondir=False)
@example(leftovers=ISSUE_ATTACKS[0] + ISSUE_ATTACKS[1], right=True, commondir=True)
async def test_leftovers_never_change_the_reward(
    backend: LocalBackend,
    image: str,
    monkeypatch: pytest.MonkeyPatch,
    verify_sandbox: str,
    leftovers: list[Leftover],
    right: bool,
    commondir: bool,
) -> None:
    """`same, no put-back`: the work dir's grader files are not snapshotted (as for an image without find, tar or
    base64), so nothing of the agent's is removed or restored before verify: the test grader's own isolation holds
    alone."""
    if verify_sandbox == "same, no put-back":
        monkeypatch.setattr(integrity, "scan", no_put_back)
    steps = solution(ADD if right else WRONG_ADD, leftovers, commondir)
    result = await run_rollout(request(image, steps, verify_sandbox.partition(",")[0]), backend)
    shown = ([item.command()[:200] for item in leftovers], result.error, result.verify_results[-1:], result.integrity)
    assert result.status == "completed", shown
    if verify_sandbox == "same, no put-back":
        assert any("not snapshotted" in warning for warning in result.warnings), result.warnings
    assert result.reward == (1.0 if right else 0.0), shown
    assert [test.outcome for test in result.test_outcomes] == (["passed"] * 2 if right else ["failed", "passed"]), shown
    assert not [finding for finding in result.integrity if finding.kind == "report_forged"], shown


def test_the_payloads_are_live(tmp_path: Path) -> None:
    """What the property relies on: each payload parses where its program reads it, and does its act when run as
    someone whose HOME is not the agent's."""
    for kind in PY_PAYLOADS:
        compile(python_payload(kind), "payload.py", "exec")
    config = tmp_path / "config"
    config.write_text(GIT_FILES[".git/config"])
    listed = subprocess.run(["git", "config", "-f", str(config), "--list"], capture_output=True, text=True, check=True)
    assert f"filter.x.clean={FIX_SHELL}; cat" in listed.stdout.splitlines()
    assert f"core.fsmonitor={FIX_SHELL}; false" in listed.stdout.splitlines()
    for text in INI.values():
        assert "{opts}" in text


@pytest.mark.parametrize(
    ("leftovers", "run_them"),
    [
        ([Leftover(WORKDIR, "zz_payload.py", python_payload("fix").encode())], "python3 -c 'import zz_payload'"),
        ([], "git status >/dev/null"),
    ],
    ids=["python payload", "git commondir filter"],
)
async def test_the_payloads_act_when_something_runs_them(
    backend: LocalBackend, no_leaks: None, image: str, leftovers: list[Leftover], run_them: str
) -> None:
    """The control: the agent itself runs a payload as someone whose HOME is not its own, and the wrong answer it
    wrote becomes right (so the property above could fail)."""
    steps = [*solution(WRONG_ADD, leftovers, commondir=not leftovers), f"cd {WORKDIR} && HOME=/tmp {run_them}"]
    result = await run_rollout(request(image, steps, "same"), backend)
    assert (result.status, result.reward) == ("completed", 1.0), (result.solution_results, result.verify_results)


async def test_an_unreadable_leftover_does_not_fail_a_fresh_copy(
    backend: LocalBackend, no_leaks: None, image: str
) -> None:
    leftover = Leftover(WORKDIR, "notes.txt", b"x\n", mode=0)
    result = await run_rollout(request(image, solution(ADD, [leftover], commondir=False), "fresh"), backend)
    assert (result.status, result.reward) == ("completed", 1.0), (result.error, result.verify_results)
