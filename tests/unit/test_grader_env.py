"""Verify's environment and the grader-file diff, without a sandbox: the real Python and git of this machine run
under the variables verify gets, and the diff is a pure function."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.rollout.check_task import task_warnings
from opencode_env.rollout.graded_tests import grade, junit_key
from opencode_env.rollout.grader_env import declares_repository, verify_environment
from opencode_env.rollout.integrity import Entry, Listing, parse_listing, removal_command, repair, scan_command
from opencode_env.sandbox import grader_python
from opencode_env.wire import RolloutRequest, RolloutResult, result_summary
from opencode_env.wire.grading import GradedTest, GradedTests, IntegrityFinding, tampering


def grader_env(tmp_path: Path, workdir: Path, *, agent_repository: bool = False) -> dict[str, str]:
    """verify_environment with the grader's directories moved under tmp_path (the sandbox's are absolute)."""
    startup = tmp_path / "python"
    startup.mkdir(exist_ok=True)
    (startup / grader_python.SITECUSTOMIZE).write_text(grader_python.SITECUSTOMIZE_SOURCE)
    env = verify_environment({"TASK_VAR": "kept"}, str(workdir), agent_repository=agent_repository)
    env.update(PYTHONPATH=str(startup), PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"))
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}


def test_the_task_env_is_kept_and_the_grader_wins() -> None:
    env = verify_environment({"TASK_VAR": "x", "GIT_PAGER": "less"}, "/home/user/workdir")
    assert env["TASK_VAR"] == "x"
    assert env["GIT_PAGER"] == "cat"
    assert env["GIT_CEILING_DIRECTORIES"] == "/home/user"
    keys = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))}
    assert keys["core.fsmonitor"] == "false"
    assert keys["core.hooksPath"] == "/dev/null"


def test_a_work_dir_module_shadows_nothing_but_stays_importable(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    (workdir / "json").mkdir(parents=True)
    (workdir / "json" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    (workdir / "add.py").write_text("def add(a, b):\n    return a + b\n")
    env = grader_env(tmp_path, workdir)
    check = "import json, add; print(json.__file__.startswith(sys.prefix) or 'stdlib', add.add(2, 3))"
    for argv in (["-c", f"import sys; {check}"], ["script.py"]):
        (workdir / "script.py").write_text(f"import sys\n{check}\n")
        done = subprocess.run(
            [sys.executable, *argv], cwd=workdir, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == "5"


def test_an_unchecked_hash_pyc_beside_a_source_is_never_read(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    (workdir / "__pycache__").mkdir(parents=True)
    (workdir / "helper.py").write_text("VALUE = 'source'\n")
    forged = workdir / "forged.py"
    forged.write_text("VALUE = 'forged'\n")
    py_compile.compile(
        str(forged),
        cfile=str(workdir / "__pycache__" / f"helper.{sys.implementation.cache_tag}.pyc"),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    run = [sys.executable, "-c", "import helper; print(helper.VALUE)"]
    plain = subprocess.run(
        run, cwd=workdir, capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]}
    )
    assert plain.stdout.strip() == "forged", "the attack works without the grader's environment"
    graded = subprocess.run(
        run, cwd=workdir, capture_output=True, text=True, check=True, env=grader_env(tmp_path, workdir)
    )
    assert graded.stdout.strip() == "source"


def test_a_repositorys_fsmonitor_never_runs(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    marker = tmp_path / "ran"
    subprocess.run(["git", "init", "-q", str(workdir)], check=True)
    subprocess.run(["git", "-C", str(workdir), "config", "core.fsmonitor", f"touch {marker}; false"], check=True)
    subprocess.run(["git", "-C", str(workdir), "status"], capture_output=True, check=False)
    assert marker.exists(), "the attack works without the grader's environment"
    marker.unlink()
    env = grader_env(tmp_path, workdir, agent_repository=True)
    done = subprocess.run(["git", "-C", str(workdir), "status"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


def test_git_sees_no_repository_of_the_agents_unless_the_task_declares_it(tmp_path: Path) -> None:
    """`.git/commondir` pointing at a config with a clean filter, a `.gitattributes` naming it, a tracked file whose
    stat changed: `git status` runs the filter, except under verify's environment, where there is no repository."""
    workdir, elsewhere, marker = tmp_path / "work", tmp_path / "elsewhere", tmp_path / "ran"
    workdir.mkdir()
    subprocess.run(["git", "init", "-q", str(workdir)], check=True)
    (workdir / ".gitattributes").write_text("* filter=x\n")
    (workdir / "add.py").write_text("def add(a, b):\n    return a - b\n")
    subprocess.run(["git", "-C", str(workdir), "add", "-A"], check=True)
    elsewhere.mkdir()
    (elsewhere / "config").write_text(f'[filter "x"]\n\tclean = touch {marker}; cat\n')
    (workdir / ".git" / "commondir").write_text(f"{elsewhere}\n")
    for name in ("objects", "refs"):
        (workdir / ".git" / name).rename(elsewhere / name)
    os.utime(workdir / "add.py", (1, 1))
    subprocess.run(["git", "-C", str(workdir), "status"], capture_output=True, check=False)
    assert marker.exists(), "the attack works without the grader's environment"
    marker.unlink()
    os.utime(workdir / "add.py", (2, 2))
    done = subprocess.run(
        ["git", "-C", str(workdir), "status"],
        env=grader_env(tmp_path, workdir),
        capture_output=True,
        text=True,
        check=False,
    )
    assert "not a git repository" in done.stderr
    assert not marker.exists()
    assert declares_repository([".git"])
    assert declares_repository(["./.git/config"])
    assert not declares_repository(["src/.git", ".github/x"])


def test_a_dist_info_in_the_work_dir_names_no_plugin_in_any_case(tmp_path: Path) -> None:
    """`python -m pytest` from the work dir under verify's environment: the work dir is on sys.path (its tests
    import the solution), but an `Evil.DIST-INFO/entry_points.txt` there names no pytest plugin."""
    workdir = tmp_path / "work"
    (workdir / "Evil.DIST-INFO").mkdir(parents=True)
    (workdir / "Evil.DIST-INFO" / "entry_points.txt").write_text("[pytest11]\nzz = zz_plugin\n")
    (workdir / "Evil.DIST-INFO" / "METADATA").write_text("Metadata-Version: 2.1\nName: zz\nVersion: 1\n")
    (workdir / "zz_plugin.py").write_text("import os\nos._exit(0)\n")
    (workdir / "test_add.py").write_text("def test_add():\n    assert 2 + 3 == 6\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_add.py"]
    plain = subprocess.run(
        argv, cwd=workdir, env={**os.environ, "PYTHONPATH": str(workdir)}, capture_output=True, check=False
    )
    assert plain.returncode == 0, "the attack works without the grader's environment"
    graded = subprocess.run(
        argv, cwd=workdir, env=grader_env(tmp_path, workdir), capture_output=True, text=True, check=False
    )
    assert graded.returncode == 1, graded.stdout
    assert "1 failed" in graded.stdout


def listing(entries: dict[str, tuple[str, bytes | None]]) -> Listing:
    made = Listing()
    for path, (kind, content) in entries.items():
        made.entries[path] = Entry(kind, len(content or b""), "1")
        if content is not None:
            made.contents[path] = content
    return made


def test_the_diff_removes_what_the_agent_made_and_restores_what_it_changed() -> None:
    before = listing(
        {"pytest.ini": ("f", b"[pytest]\n"), "conftest.py": ("f", b"x = 1\n"), "lib/x.cpython-311.pyc": ("f", None)}
    )
    after = listing(
        {
            "pytest.ini": ("f", b"[pytest]\naddopts = --co\n"),
            "pytest": ("d", None),
            "pytest/__init__.py": ("f", b""),
            "tests/conftest.py": ("f", b"import os\n"),
            "pyproject.toml": ("f", b"[project]\n"),
            "tests/__pycache__": ("d", None),
            "tests/__pycache__/helper.cpython-311.pyc": ("f", None),
            "lib/x.cpython-311.pyc": ("f", None),
        }
    )
    plan = repair(before, after, ["pyproject.toml"])
    assert plan.restore == {"pytest.ini": "[pytest]\n", "conftest.py": "x = 1\n"}
    assert sorted(plan.remove) == ["lib/x.cpython-311.pyc", "pytest", "tests/__pycache__", "tests/conftest.py"]
    acts = {(f.path, f.kind, f.act, f.response) for f in plan.findings}
    assert acts == {
        ("conftest.py", "conftest", "deleted", "restored"),
        ("pytest.ini", "test_config", "changed", "restored"),
        ("pytest", "shadow_module", "created", "removed"),
        ("pyproject.toml", "test_config", "created", "kept"),
        ("tests/__pycache__", "bytecode", "created", "removed"),
        ("tests/conftest.py", "conftest", "created", "removed"),
    }
    assert tampering(plan.findings) == ["conftest", "shadow_module", "test_config"]


def test_the_scan_and_the_removal_keep_odd_names_exact(tmp_path: Path) -> None:
    odd = "tests/we ird\nname\udcff/conftest.py"
    target = tmp_path / os.fsencode(odd).decode("utf-8", "surrogateescape")
    target.parent.mkdir(parents=True)
    target.write_text("import os\n")
    (tmp_path / "add.py").write_text("")
    listed = parse_listing(
        subprocess.run(
            ["sh", "-c", scan_command(str(tmp_path))],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            check=True,
        ).stdout
    )
    assert odd in listed.entries
    assert listed.contents[odd] == b"import os\n"
    subprocess.run(["sh", "-c", removal_command([odd])], cwd=tmp_path, check=True)
    assert not target.exists()
    assert (tmp_path / "add.py").exists()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"verify": ["python -m pytest -q"]}, "hands over no protected tests"),
        ({"verify": ["pytest tests"], "files": {"tests/test_a.py": "x"}, "verify_files": {"b": "y"}}, "can change"),
        ({"verify": ["true"], "solution_files": ["conftest.py"]}, "solution_files names conftest.py"),
    ],
)
def test_check_task_warns_of_what_lets_an_agent_move_its_grade(fields: dict[str, object], expected: str) -> None:
    request = RolloutRequest.model_validate({"instruction": "x", **fields})
    assert any(expected in warning for warning in task_warnings(request)), task_warnings(request)


def test_a_task_handing_its_tests_over_gets_no_warning() -> None:
    request = RolloutRequest.model_validate(
        {"instruction": "x", "verify": ["python -m pytest -q tests"], "verify_files": {"tests/test_a.py": "x"}}
    )
    assert task_warnings(request) == []


def test_old_results_without_findings_still_parse() -> None:
    finding = IntegrityFinding(path="conftest.py", kind="conftest", act="created", response="removed")
    assert IntegrityFinding.model_validate_json(finding.model_dump_json()) == finding


def test_junit_names_and_the_reward_by_id() -> None:
    assert junit_key("a/test_b.py::C::t[1]") == ("a.test_b.C", "t[1]")
    spec = GradedTests(files={"t.py": ""}, fail_to_pass=["t.py::a", "t.py::b"], pass_to_pass=["t.py::c"])
    report = (
        b'<testsuites><testsuite><testcase classname="t" name="a"/>'
        b'<testcase classname="t" name="b"><failure message="x"/></testcase></testsuite></testsuites>'
    )
    graded = grade(spec, report)
    assert [test.outcome for test in graded.outcomes] == ["passed", "failed", "missing"]
    assert graded.reward == 0.0
    assert grade(spec.model_copy(update={"scoring": "fraction"}), report).reward == pytest.approx(1 / 3)
    assert grade(spec, None).reward == 0.0
    assert grade(spec, b"<not xml").reward == 0.0


def test_a_sitecustomize_in_the_work_dir_is_not_the_images(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "sitecustomize.py").write_text("raise SystemExit('the agent ran first')\n")
    done = subprocess.run(
        [sys.executable, "-c", "print('graded')"],
        cwd=workdir,
        env=grader_env(tmp_path, workdir),
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "graded\n"), done.stderr


def test_the_summary_names_the_findings_and_the_tests() -> None:
    result = RolloutResult(
        integrity=[IntegrityFinding(path="conftest.py", kind="conftest", act="created", response="removed")],
        test_outcomes=[GradedTest(test_id="t.py::a", expected="fail_to_pass", outcome="failed")],
    )
    summary = result_summary(result)
    assert "integrity:  1 (conftest.py created->removed)" in summary
    assert "tests:      0/1 expected ids passed" in summary
    assert RolloutResult.model_validate_json(result.model_dump_json()) == result
    assert RolloutResult.model_validate_json('{"task_id": "t", "status": "completed", "reward": 1.0}').integrity == []
