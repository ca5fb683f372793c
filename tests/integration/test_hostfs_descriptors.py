"""hostfs with few descriptors: a very deep and a very wide tree walked by a fresh interpreter allowed 64 open
descriptors (it starts a process, so it lives here rather than in the unit tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.test_hostfs_hostile import OWNER, base

__all__ = ["base"]


CHECKOUT = Path(__file__).resolve().parents[2]


def run_with_few_descriptors(source: str, limit: int = 64) -> str:
    """Run `source` in a fresh interpreter allowed `limit` open descriptors; returns its output."""
    prelude = f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + source], capture_output=True, text=True, cwd=CHECKOUT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_3000_deep_tree_is_chowned_and_removed_with_a_few_descriptors(base: Path) -> None:
    output = run_with_few_descriptors(
        "import os\n"
        "from pathlib import Path\n"
        "from opencode_env.sandbox.local.files import hostfs_write\n"
        f"base = Path({str(base)!r})\n"
        "fd = os.open(base, os.O_RDONLY)\n"
        "for name in ['workdir'] + ['d'] * 3000:\n"
        "    os.mkdir(name, dir_fd=fd)\n"
        "    child = os.open(name, os.O_RDONLY, dir_fd=fd)\n"
        "    os.close(fd)\n"
        "    fd = child\n"
        "os.close(os.open('leaf.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"
        f"print(hostfs_write.chown_tree(base, 'workdir', owner={OWNER}))\n"
        "print(os.stat('leaf.txt', dir_fd=fd).st_uid)\n"
        f"hostfs_write.reset_dir(base, 'workdir', owner={OWNER})\n"
        "print(os.listdir(base / 'workdir'))\n",
    )
    assert output.splitlines() == ["3001", str(OWNER[0]), "[]"]


def test_a_wide_tree_is_listed_whole_with_a_few_descriptors(base: Path) -> None:
    for index in range(300):
        (base / "work" / f"d{index:03}").mkdir(parents=True)
        (base / "work" / f"d{index:03}" / "f.txt").write_text("x")
    output = run_with_few_descriptors(
        "from pathlib import Path\n"
        "from opencode_env.sandbox.local.files import hostfs\n"
        f"print(len(hostfs.list_files(Path({str(base)!r}), 'work', limit=10_000)))\n"
    )
    assert output.strip() == "300"
