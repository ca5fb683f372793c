"""Each file of opencode_env/inside/ (the code that runs in a sandbox as a file of its own) runs alone: copied to an
empty directory and started under `python -I -S`, with nothing of opencode_env importable, it imports, and its entry
does its job (a work dir's `*.dist-info`, on sys.path after start-up, is no distribution). The import contract keeps
them from importing the package; this proves they never need it (they start Python, so they live here rather than in
the unit tier)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.rollout.grading import by_value

INSIDE = Path(__file__).resolve().parents[2] / "opencode_env" / "inside"
FILES = sorted(path.name for path in INSIDE.glob("*.py") if path.name != "__init__.py")

ENTRIES = {
    "seccomp_exec.py": "import seccomp_exec; print(seccomp_exec.parse_environment(b'A=1\\0B=x=y\\0'))",
    "userns.py": "import userns; print(userns._ranges(['0:2000:1', '1000:3000:2']))",
    "nofollow.py": (
        "import os, nofollow; fd = nofollow.open_dir(os.open('.', nofollow.DIR_FLAGS), ['Fake-1.0.dist-info']); "
        "print(os.listdir(fd))"
    ),
    "prefix.py": "import prefix; print(prefix.common_prefix_length([1, 2, 3], [1, 2, 4]))",
    "pinned_finder.py": (
        "import os, sys, pinned_finder; from importlib import metadata; pinned_finder.pin_distributions(sys.path); "
        "sys.path.append(os.getcwd()); print(len(list(metadata.distributions())))"
    ),
    "sitecustomize.py": (
        "import sys; sys.argv = ['']; import sitecustomize; from importlib import metadata; "
        "print(len(list(metadata.distributions())), sys.path[-1] == __import__('os').getcwd())"
    ),
    "pytest_runner.py": (
        "import pytest_runner; print(pytest_runner.parse(['--tests', 't', '--workdir', 'w', '--', 'x']))"
    ),
    "tool_broker.py": (
        "import tool_broker as b; print(sorted(b.tool_environment({'OPENCODE_X': '1', 'A': '2'}, {'T': '3'}, "
        "'/home/user', 'user')))"
    ),
    "by_value_wire.py": "import by_value_wire as w; print(w.decode(w.encode([1, 'a', (2, b'x'), {3: None}])))",
    "by_value_client.py": (
        "sys.path.insert(0, PACKAGE); from opencode_env.inside import by_value_client as c; "
        "print(c._builtin_base(['task.Mine', 'builtins.ValueError', 'builtins.Exception']).__name__)"
    ),
    "by_value_server.py": (
        "sys.path.insert(0, PACKAGE); from opencode_env.inside import by_value_server as s; "
        "print(s.exception_chain(KeyError))"
    ),
}
"""The by-value three run as the host hands them: a package of their own (opencode_env/inside/, nothing else)."""
EXPECTED = {
    "seccomp_exec.py": "{b'A': b'1', b'B': b'x=y'}",
    "userns.py": "[(0, 2000, 1), (1000, 3000, 2)]",
    "nofollow.py": "['METADATA']",
    "prefix.py": "2",
    "pinned_finder.py": "0",
    "sitecustomize.py": "0 True",
    "pytest_runner.py": "({'--tests': 't', '--workdir': 'w'}, ['x'])",
    "tool_broker.py": "['A', 'HOME', 'LOGNAME', 'SHELL', 'T', 'USER']",
    "by_value_wire.py": "[1, 'a', (2, b'x'), {3: None}]",
    "by_value_client.py": "ValueError",
    "by_value_server.py": (
        "['builtins.KeyError', 'builtins.LookupError', 'builtins.Exception', 'builtins.BaseException', "
        "'builtins.object']"
    ),
}


def test_every_file_has_an_entry_here() -> None:
    assert sorted(ENTRIES) == FILES


@pytest.mark.parametrize("name", FILES)
def test_each_file_runs_alone_under_isolated_python(name: str, tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    for shipped in FILES:
        shutil.copy(INSIDE / shipped, alone / shipped)
    package = tmp_path / "package"
    for handed, text in by_value.handed_files().items():
        (package / handed.removeprefix(f"{by_value.ROOT}/")).parent.mkdir(parents=True, exist_ok=True)
        (package / handed.removeprefix(f"{by_value.ROOT}/")).write_text(text)
    work = tmp_path / "work"
    (work / "Fake-1.0.dist-info").mkdir(parents=True)
    (work / "Fake-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fake\nVersion: 1.0\n")
    entry = ENTRIES[name].replace("PACKAGE", repr(str(package)))
    code = f"import sys; sys.path.insert(0, {str(alone)!r}); {entry}"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], cwd=work, capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == EXPECTED[name]
    ours = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import opencode_env"],
        cwd=alone,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ours.returncode != 0
