"""The host's OpenCode for the local backend: installed once per machine into a cache, shared by every rollout."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from opencode_env.pins import OPENCODE_PACKAGE, OPENCODE_VERSION
from opencode_env.sandbox.base import ProvidedTools


class InstallError(Exception):
    """OpenCode could not be installed."""


def cache_root() -> Path:
    configured = os.environ.get("OPENCODE_ENV_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "opencode-env"


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
    base = root or cache_root()
    prefix = base / f"opencode-{version}"
    binary = _installed_binary(prefix)
    if (prefix / ".complete").exists():
        return binary
    base.mkdir(parents=True, exist_ok=True)
    with (base / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (prefix / ".complete").exists():
            return binary
        if shutil.which("npm") is None:
            raise InstallError("npm is not installed; OpenCode is installed from the npm registry (Node >= 20).")
        staging = Path(tempfile.mkdtemp(prefix=f".opencode-{version}-", dir=base))
        completed = subprocess.run(
            ["npm", "install", "--no-fund", "--no-audit", "--prefix", str(staging), f"{OPENCODE_PACKAGE}@{version}"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if completed.returncode != 0 or not _installed_binary(staging).exists():
            shutil.rmtree(staging, ignore_errors=True)
            raise InstallError(f"npm install {OPENCODE_PACKAGE}@{version} failed: {completed.stderr[-2000:]}")
        shutil.rmtree(prefix, ignore_errors=True)
        staging.rename(prefix)
        (prefix / ".complete").write_text(version)
    return binary


async def cached_tools() -> ProvidedTools:
    """The tools the local backend provides: the cached OpenCode and this interpreter (for the proxy)."""
    binary = await asyncio.to_thread(install_cached)
    # npm stages the install in a private temporary directory: sandbox users must be able to run what it holds.
    await asyncio.to_thread(_world_readable, _installed_prefix(binary))
    return ProvidedTools(
        opencode=str(binary), opencode_version=OPENCODE_VERSION, python=sys.executable, proxy_ready=True
    )


PROXY_PYTHON_PACKAGES = ("fastapi", "uvicorn", "uvloop", "httptools")
