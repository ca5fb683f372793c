"""The host's OpenCode for the local backend: installed once per machine into a cache, shared by every rollout."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from opencode_env.sandbox.base import ProvidedTools, SandboxError
from opencode_env.wire import OPENCODE_PACKAGE, OPENCODE_VERSION, PLUGIN_PACKAGE

log = logging.getLogger("opencode_env.local_tools")


class InstallError(SandboxError):
    """OpenCode could not be installed (the sandbox cannot be made ready)."""


def cache_root(configured: str | Path = "") -> Path:
    """Our caches: `configured` (the operator's OPENCODE_ENV_CACHE, passed down from the settings), else
    ~/.cache/opencode-env."""
    return Path(configured) if configured else Path.home() / ".cache" / "opencode-env"


def npm_cache(base: Path | None = None) -> Path:
    """npm's cache for our installs, kept beside them: what was fetched once installs again offline."""
    return (base or cache_root()) / "npm-cache"


def _installed_prefix(binary: Path) -> Path:
    return binary.parents[2]


def _world_readable(prefix: Path) -> None:
    mode = prefix.stat().st_mode
    if mode & 0o055 != 0o055:
        prefix.chmod(mode | 0o055)


def _installed_binary(prefix: Path) -> Path:
    return prefix / "node_modules" / ".bin" / "opencode"


def install_cached(version: str = OPENCODE_VERSION, root: Path | None = None) -> Path:
    """Install OpenCode once per machine under the cache; concurrent callers wait on a file lock."""
    prefix = _npm_install_once(root or cache_root(), f"opencode-{version}", OPENCODE_PACKAGE, version)
    return _installed_binary(prefix)


def install_config_deps(version: str = OPENCODE_VERSION, root: Path | None = None) -> Path:
    """What OpenCode npm-installs into its config directory at every start (`@opencode-ai/plugin`), installed once:
    each rollout's config directory mounts it, so OpenCode finds it in place and contacts no registry."""
    return _npm_install_once(root or cache_root(), f"opencode-config-{version}", PLUGIN_PACKAGE, version)


def _npm_install_once(base: Path, name: str, package: str, version: str) -> Path:
    prefix = base / name
    if (prefix / ".complete").exists():
        return prefix
    base.mkdir(parents=True, exist_ok=True)
    with (base / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (prefix / ".complete").exists():
            return prefix
        if shutil.which("npm") is None:
            raise InstallError(f"npm is not installed; {package} is installed from the npm registry (Node >= 20).")
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
        completed = subprocess.run(
            [
                "npm",
                "install",
                "--no-fund",
                "--no-audit",
                *("--cache", str(npm_cache(base))),
                *("--prefix", str(staging)),
                f"{package}@{version}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if completed.returncode != 0 or not (staging / "node_modules" / package / "package.json").exists():
            shutil.rmtree(staging, ignore_errors=True)
            raise InstallError(f"npm install {package}@{version} failed: {completed.stderr[-2000:]}")
        shutil.rmtree(prefix, ignore_errors=True)
        staging.rename(prefix)
        (prefix / ".complete").write_text(version)
    return prefix


async def cached_tools(root: Path | None = None) -> ProvidedTools:
    """The tools the local backend provides: the OpenCode cached under `root` (default `cache_root()`) and this
    interpreter (for the proxy)."""
    binary = await asyncio.to_thread(install_cached, OPENCODE_VERSION, root)
    try:
        config_deps: Path | None = await asyncio.to_thread(install_config_deps, OPENCODE_VERSION, root)
    except InstallError as error:
        log.warning("OpenCode will try to fetch its plugin package at every start: %s", error)
        config_deps = None
    # npm stages the install in a private temporary directory: sandbox users must be able to run what it holds.
    for prefix in (_installed_prefix(binary), config_deps):
        if prefix is not None:
            await asyncio.to_thread(_world_readable, prefix)
    return ProvidedTools(
        opencode=str(binary),
        opencode_version=OPENCODE_VERSION,
        python=sys.executable,
        proxy_ready=True,
        opencode_config_deps=str(config_deps) if config_deps else None,
    )
