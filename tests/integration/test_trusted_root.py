"""Trusted programs are started from what no identity of a sandbox can change, wherever the checkout lives: the
package is copied under /tmp, under /home/user and elsewhere, and a sandbox is run from that copy (a subprocess
importing it), as a CI clone, pytest's temporary directories or a checkout in the operator's home would."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.isolation.bubblewrap import CONTROL_MOUNT, RUNTIME_MOUNT
from opencode_env.sandbox.local.isolation.command_argv import TOOL_SHELL
from tests.trusted_walk import trusted_paths, walk

ROOT = Path(__file__).resolve().parents[2]
WALK = ROOT / "tests" / "trusted_walk.py"
PLACES = {"tmp": Path("/tmp"), "home-user": Path("/home/user"), "elsewhere": Path("/var/tmp")}


@pytest.fixture(params=sorted(PLACES))
def checkout(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A copy of the package in one of PLACES (the directory its parent is), removed after the test, and beside it
    a runtime directory the sandbox puts on PATH (as the cloud fakes put a virtualenv's bin): a host runtime path
    under /tmp or /home/user, which the sandbox shows there too."""
    place = PLACES[request.param]
    place.mkdir(parents=True, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix="trusted-root-checkout-", dir=place))
    try:
        shutil.copytree(ROOT / "opencode_env", parent / "opencode_env", ignore=shutil.ignore_patterns("__pycache__"))
        runtime = parent / "runtime" / "bin"
        runtime.mkdir(parents=True)
        (runtime / "hello").write_text("#!/bin/sh\necho hello\n")
        for directory in (parent, runtime.parent, runtime):
            directory.chmod(0o755)
        (runtime / "hello").chmod(0o755)
        yield parent
    finally:
        shutil.rmtree(parent)


def _run(checkout: Path, base: Path, mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(WALK), str(checkout), str(base), mode],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert str(report["package"]).startswith(str(checkout)), report
    return report


@pytest.mark.parametrize("identity", ["user", "root"])
def test_a_task_that_plants_userns_py_where_the_checkout_is_never_runs_as_the_host_s_root(
    checkout: Path, sandbox_base: Path, identity: str
) -> None:
    """The issue's attack: a command moves away the directory above the checkout's userns.py (seen at its host path
    in the sandbox's /tmp or /home/user) and writes its own there; every later command still runs, and nothing
    the task wrote runs as the host's root (the canary it would leave is absent)."""
    report = _run(checkout, sandbox_base, identity)
    assert report["ran"] == {"user": "ok", "root": "ok", "grader": "ok", "agent": "ok"}, report
    assert report["canary"] is False, report


def test_no_identity_can_change_a_path_our_programs_start_or_read(checkout: Path, sandbox_base: Path) -> None:
    """The boundary as a property of a live sandbox: each identity (user, the sandbox's root in a command's own
    namespaces and in the holder's, the grader, OpenCode's) tries to rename, write, create in or chmod every path
    of the trusted chain and every directory above it; none succeeds."""
    report = _run(checkout, sandbox_base, "walk")
    assert report["runtime_on_path"] == ["hello", "1777"], report
    found = report["found"]
    assert isinstance(found, dict)
    assert found == {key: [] for key in found}, json.dumps(found, indent=1)[:6000]


OUR_NAMES = ("run", "opencode-runtime", "opencode-env", "root", ".pyenv", ".cache", "usr", "bin", "lib", "userns.py")
OUR_NAMES += ("seccomp_exec.py", "python3", "shell", "bash", "tmp", "home", "user", "opencode", "config", "sh")
PLANT = st.tuples(
    st.sampled_from(["/home/user", "/home/user/workdir", "/tmp"]),
    st.lists(st.sampled_from(OUR_NAMES), min_size=1, max_size=4),
    st.sampled_from(["dir", "file", "link to /", "link to our runtime", "link to our control dir", "link up"]),
    st.sampled_from(["user", "root"]),
)


def _plant_command(place: str, names: list[str], kind: str) -> str:
    path = shlex.quote("/".join([place, *names]))
    target = {
        "link to /": "/",
        "link to our runtime": RUNTIME_MOUNT,
        "link to our control dir": CONTROL_MOUNT,
        "link up": "../" * 6,
    }.get(kind)
    make = f"mkdir -p {path}" if kind == "dir" else f"printf x > {path}"
    if target is not None:
        make = f"ln -sfn {shlex.quote(target)} {path}"
    return f"mkdir -p $(dirname {path}) 2>/dev/null; rm -rf {path} 2>/dev/null; {make} 2>/dev/null; true"


@settings(
    max_examples=4,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plants=st.lists(PLANT, min_size=1, max_size=12))
@pytest.mark.timeout(1800)
async def test_hostile_names_in_home_work_dir_and_tmp_change_nothing_we_start(
    backend: LocalBackend, plants: list[tuple[str, list[str], str, str]]
) -> None:
    """A home, work dir and /tmp filled (as `user` and as the sandbox's root, in setup's namespaces) with names like
    our paths, links to /, to our runtime and control directories: every identity's command and the agent's tools'
    shell still run as themselves, and no identity can change a path of the trusted chain or a directory above it."""
    sandbox = await backend.create(SandboxSpec(image="host"))
    try:
        for place, names, kind, identity in plants:
            planted = await sandbox.run(
                _plant_command(place, names, kind), timeout_s=60, identity=identity, cwd="/", keep_background=True
            )
            assert planted.exit_code == 0, planted.stderr
        for identity in ("user", "root", "grader", "agent"):
            ran = await sandbox.run("id -u", timeout_s=60, identity=identity, cwd="/")
            assert ran.exit_code == 0, (identity, ran.stderr)
            assert ran.stdout.strip() == {"user": "1000", "grader": "1001"}.get(identity, "0"), identity
        tools = await sandbox.run(f"{TOOL_SHELL} -c 'id -u'", timeout_s=60, identity="agent", cwd="/")
        assert tools.stdout.strip() == "1000", tools.stderr
        paths = trusted_paths(sandbox)
        found = await walk(sandbox, {"walk": [], "probe": sorted({*paths["walk"], *paths["probe"]})}, minimum=10)
        assert found == {key: [] for key in found}, json.dumps(found, indent=1)[:6000]
    finally:
        await sandbox.close()
