"""The cloud backends' OpenCode probe reads the version from the manifest of the package the binary on the PATH belongs
to, and asks the binary only where there is none: run through sh with stand-in binaries that record being run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from opencode_env.sandbox.cloud.e2b import PROBE
from opencode_env.sandbox.cloud.hf_shell import OPENCODE_PROBE, parse_probe


def opencode_at(root: Path, manifest: dict[str, str] | None) -> Path:
    """A package directory holding bin/opencode, a script that notes it ran and prints 0.0.1, and the manifest."""
    (root / "bin").mkdir(parents=True)
    binary = root / "bin" / "opencode"
    binary.write_text(f"#!/bin/sh\ntouch {root / 'ran'}\necho 0.0.1\n")
    binary.chmod(0o755)
    if manifest is not None:
        (root / "package.json").write_text(json.dumps(manifest))
    return root


def probe(command: str, directory: Path, package: Path | None) -> str:
    """`command` with a PATH holding a link to the package's binary (as npm links it), or no OpenCode at all."""
    links = directory / "links"
    links.mkdir()
    if package is not None:
        (links / "opencode").symlink_to(package / "bin" / "opencode")
    done = subprocess.run(
        ["sh", "-c", command], env={"PATH": f"{links}:/usr/bin:/bin"}, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_the_version_comes_from_the_manifest_without_running_opencode(tmp_path: Path) -> None:
    package = opencode_at(tmp_path / "opencode-ai", {"name": "opencode-ai", "version": "1.18.33"})
    assert parse_probe(probe(OPENCODE_PROBE, tmp_path, package)) == ("1.18.33", False)
    assert not (package / "ran").exists()


def test_the_per_platform_package_our_install_unpacks_counts_too(tmp_path: Path) -> None:
    package = opencode_at(tmp_path / "package", {"name": "opencode-linux-x64-baseline", "version": "1.18.33"})
    assert parse_probe(probe(OPENCODE_PROBE, tmp_path, package))[0] == "1.18.33"
    assert not (package / "ran").exists()


def test_without_an_opencode_manifest_opencode_itself_is_asked(tmp_path: Path) -> None:
    for name, manifest in (("bare", None), ("other", {"name": "left-pad", "version": "9.9.9"})):
        package = opencode_at(tmp_path / name / "package", manifest)
        assert parse_probe(probe(OPENCODE_PROBE, tmp_path / name, package))[0] == "0.0.1", name
        assert (package / "ran").exists(), name


def test_no_opencode_on_the_path_is_no_version_and_the_e2b_probe_still_reports_the_rest(tmp_path: Path) -> None:
    assert parse_probe(probe(OPENCODE_PROBE, tmp_path, None)) == (None, False)
    (tmp_path / "e2b").mkdir()
    stdout = probe(PROBE, tmp_path / "e2b", None)
    assert stdout.splitlines()[0] == "template-format=none"
    assert parse_probe(stdout)[0] is None
