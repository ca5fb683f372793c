"""The command that clears a task directory of the agent's entries, run by a real shell over a real tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

from opencode_env.rollout import task_dirs


def test_the_clear_command_removes_all_but_the_kept_names_and_follows_no_link(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "tests" / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious").write_text("x")
    for name in ("test_a.py", "[a]*.py", "test_zz.py", "__init__.py", "sub/x.py"):
        (work / "tests" / name).write_text("")
    (work / "linked").symlink_to(outside)
    kept = frozenset({"test_a.py", "[a]*.py"})
    ran = subprocess.run(
        ["sh", "-c", task_dirs.clear_command("tests", kept)], cwd=work, capture_output=True, text=True, check=True
    )
    assert sorted(ran.stdout.split("\0")[:-1]) == ["./__init__.py", "./sub", "./test_zz.py"]
    assert sorted(path.name for path in (work / "tests").iterdir()) == sorted(kept)
    subprocess.run(["sh", "-c", task_dirs.clear_command("linked", frozenset())], cwd=work, check=True)
    assert (outside / "precious").exists()
