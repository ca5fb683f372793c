"""The capture proxy's compartment reaches its own package wherever the package lives, a checkout of mode 0700
included (`mktemp -d` makes one): the compartment binds the package's directory, and the directories leading to it
are made in the compartment's tmpfs and opened up there, while a directory bound from the host keeps its host mode,
which the proxy's unprivileged uid cannot cross."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import opencode_env
from opencode_env.sandbox.base import ProvidedTools
from opencode_env.sandbox.local.isolation.bubblewrap import _hidden_tmpfs, _inside_hidden_roots, _runtime_binds
from opencode_env.sandbox.local.isolation.host_view import runtime_paths

UNPRIVILEGED = "2000123456"


def read_as_unprivileged(bound: list[str], path: Path) -> subprocess.CompletedProcess[str]:
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *_hidden_tmpfs()]
    argv += [*_runtime_binds(bound, _inside_hidden_roots), "--"]
    argv += ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups", "cat", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def test_the_proxy_is_given_its_package_not_the_directory_above_it() -> None:
    package = Path(opencode_env.__file__).resolve().parent
    paths = runtime_paths(ProvidedTools(python=sys.executable))
    assert str(package) in paths
    assert str(package.parent) not in paths or str(package.parent) in (sys.prefix, sys.base_prefix)


def test_a_package_under_a_0700_directory_is_read_by_the_proxys_uid(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "package").mkdir(parents=True)
    module = checkout / "package" / "module.py"
    module.write_text("reached\n")
    checkout.chmod(0o700)
    assert read_as_unprivileged([str(checkout / "package")], module).stdout == "reached\n"
    locked_out = read_as_unprivileged([str(checkout)], module)
    assert (locked_out.returncode, "Permission denied" in locked_out.stderr) == (1, True), locked_out
