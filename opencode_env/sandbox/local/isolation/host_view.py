"""What of the host each local compartment sees beyond its root, and the host programs an image's sandbox starts:
the runtime paths of the capture proxy and of a sandbox on the host's own system, the certificates the host trusts
(machine configuration, not a secret), and the helpers every sandbox command may start with."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from opencode_env.sandbox.base import ProvidedTools
from opencode_env.sandbox.local.isolation.bubblewrap import CONTROL_MOUNT, USERNS, runtime_inside
from opencode_env.sandbox.local.isolation.command_argv import Helpers
from opencode_env.sandbox.local.isolation.host_runtime import HostRuntime, host_program, image_runtime, outermost

# Which certificates to trust is machine configuration, not a secret: tasks that install packages need it.
TRUST_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
HELPERS = Helpers(python=runtime_inside(os.path.realpath(sys.executable)), userns=f"{CONTROL_MOUNT}/{USERNS}")
"""Started from what no identity of the sandbox can change: the interpreter at RUNTIME_MOUNT, userns.py copied into
the control directory (its host path, in a checkout, may lie under /tmp or /home/user)."""


def runtime_paths(tools: ProvidedTools) -> list[str]:
    """Host paths the capture proxy's compartment needs even when they live under a hidden root (its interpreter,
    its packages, this package). The package's own directory, never the one above it: the compartment's uid crosses
    a directory bound from the host only with its host mode, and a checkout or temporary directory is often 0700,
    while the directories leading to a bound path are made in the compartment's tmpfs and opened up there."""
    paths = {sys.base_prefix, sys.prefix, str(Path(__file__).resolve().parents[3])}
    if tools.python:
        paths.add(str(Path(tools.python).parent.parent))
    return sorted(paths)


def sandbox_runtime_paths(tools: ProvidedTools, extra_path: tuple[str, ...] = ()) -> list[str]:
    """What a sandbox's root shows of the host beyond its system directories (isolation.runtime_binds): the
    interpreter our helpers run with (-I -S) and its standard library, OpenCode's install, the Python environment a
    cloud backend's proxy runs with (a fake cloud's VM is a local sandbox), the trusted certificates, and the
    prefix of each host directory the backend was asked to put on PATH (a virtualenv's bin: the virtualenv); never
    the checkout itself, its results or anything else of the operator's."""
    paths = {sys.base_prefix, os.path.realpath(sys.executable), *trust_settings(os.environ).values()}
    if tools.python:
        paths.add(str(Path(tools.python).parent.parent))
    paths.update(prefix for directory in extra_path if os.path.isdir(prefix := str(Path(directory).parent)))
    if tools.opencode:
        paths.add(_install_root(tools.opencode))
    # a prefix worked out as "/" (a program in /bin) would bind the host's whole root: its system directories
    # are in the sandbox's root already
    return list(outermost(paths - {"/"}))


def sandbox_tools(tools: ProvidedTools) -> ProvidedTools:
    """The tools as a sandbox starts them: OpenCode from RUNTIME_MOUNT (see sandbox_runtime_paths); the proxy's
    Python stays the host's (the local proxy runs in its own compartment, on the host's root)."""
    if not tools.opencode:
        return tools
    named, install = os.path.abspath(tools.opencode), _install_root(tools.opencode)
    # by the name it was installed under (npm's bin link), which OpenCode's behaviour may depend on
    opencode = named if named.startswith(install + "/") else str(Path(tools.opencode).resolve())
    return dataclasses.replace(tools, opencode=runtime_inside(opencode))


def _install_root(binary: str) -> str:
    """The npm prefix an installed binary lives in (the directory above node_modules), else its directory."""
    resolved = Path(binary).resolve()
    for parent in resolved.parents:
        if parent.name == "node_modules":
            return str(parent.parent)
    return str(resolved.parent)


def trust_settings(host_env: Mapping[str, str]) -> dict[str, str]:
    """The host's CA-bundle settings, also given to npm (whose own config file is hidden with the host home)."""
    settings = {name: host_env[name] for name in TRUST_VARS if host_env.get(name)}
    bundle = settings.get("NODE_EXTRA_CA_CERTS") or settings.get("SSL_CERT_FILE")
    if bundle:
        settings["NPM_CONFIG_CAFILE"] = bundle
    return settings


def runtime_for() -> HostRuntime:
    """What of the host an image's task root shows (read-only at HOST_MOUNT): the host's bash, the loader and
    libraries it runs with, and the certificates the host trusts. The task's commands start that bash; nothing of
    ours runs there (our launchers and OpenCode run in the sandbox's own root, see bubblewrap.py)."""
    return image_runtime((host_program("bash"),), tuple(trust_settings(os.environ).values()))
