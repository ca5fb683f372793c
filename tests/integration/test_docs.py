"""The docs as a reader meets them: the README's in-process example runs as written, the settings page's table is the
code's, and the site's strict build refuses a broken link (so `./dev test`'s docs stage can fail)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from opencode_env.settings import markdown_table, variable_names

ROOT = Path(__file__).resolve().parents[2]


def settings_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_table", ROOT / "docs" / "hooks" / "settings_table.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_block(after: str, language: str) -> str:
    text = (ROOT / "README.md").read_text()
    rest = text.split(after, 1)[1]
    return rest.split(f"```{language}\n", 1)[1].split("\n```", 1)[0]


def test_the_settings_page_table_is_the_code_s() -> None:
    hook = settings_hook()
    page = (ROOT / "docs" / "settings.md").read_text()
    built = hook.page_with_table(page)
    assert markdown_table() in built
    assert all(f"`{name}`" in built for name in variable_names())


def test_a_settings_page_without_its_marker_is_refused() -> None:
    hook = settings_hook()
    with pytest.raises(hook.MarkerMissing, match=r"settings\.md must hold"):
        hook.page_with_table("# Settings\n\nno table here\n")


def test_the_readme_links_to_files_that_exist_and_pages_in_the_nav() -> None:
    """The README is read on GitHub and on the Space, outside the site's strict build: its links are checked here."""
    readme = (ROOT / "README.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    targets = {link.split("#", 1)[0] for link in re.findall(r"\]\(([^)#:]+(?:#[^)]*)?)\)", readme)}
    assert {"docs/getting-started.md", "docs/calling.md", "CHANGELOG.md"} <= targets
    assert [t for t in sorted(targets) if not (ROOT / t).is_file()] == []
    pages = [t.removeprefix("docs/") for t in targets if t.startswith("docs/")]
    assert [page for page in pages if f": {page}" not in nav] == []


@pytest.mark.timeout(600)
def test_the_readme_in_process_example_runs_as_written(tmp_path: Path) -> None:
    """The README's first Python example: a real rollout in-process against the scripted model, no VLLM_URL."""
    code = readme_block("**In-process**", "python")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("VLLM_", "OPENAI_", "HF_ROUTER"))}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["completed", "1.0", "3"]


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None, reason="mkdocs missing")
def test_the_strict_site_build_refuses_a_broken_link(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(ROOT / "docs", site / "docs")
    shutil.copy(ROOT / "mkdocs.yml", site / "mkdocs.yml")
    with (site / "docs" / "calling.md").open("a") as page:
        page.write("\nSee [the tasks page](tasks.md#no-such-anchor) and [a page](no-such-page.md).\n")
    mkdocs = str(Path(sys.executable).parent / "mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [mkdocs, "build", "--strict", "-d", str(tmp_path / "out")],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode != 0
    assert "no-such-anchor" in done.stderr
    assert "no-such-page.md" in done.stderr
