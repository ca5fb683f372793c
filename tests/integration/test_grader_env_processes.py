"""Verify's environment run for real: Python and git started with it against a hostile work dir, and the grader files'
scan and removal as shell commands. These start processes, so they live here rather than in the unit tier."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

from opencode_env.rollout.grading.grader_env import declares_repository, verify_environment
from opencode_env.rollout.grading.integrity import parse_listing, removal_command, scan_command
from opencode_env.sandbox import grader_python


def grader_env(tmp_path: Path, workdir: Path, *, agent_repository: bool = False) -> dict[str, str]:
    """verify_environment with the grader's directories moved under tmp_path (the sandbox's are absolute)."""
    startup = tmp_path / "python"
    startup.mkdir(exist_ok=True)
    for name, text in grader_python.GRADER_PYTHON_FILES.items():
        (startup / name).write_text(text)
    env = verify_environment({"TASK_VAR": "kept"}, str(workdir), agent_repository=agent_repository)
    env.update(PYTHONPATH=str(startup), PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"))
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}


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
