from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.cloud.hf import HFBackend
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.tools import cache_root, cached_tools, install_cached, npm_cache
from opencode_env.settings import variable as setting_variable
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FAKE_TOOLS_DIR, FakeHfCloud
from opencode_env.wire import OPENCODE_PACKAGE, OPENCODE_VERSION

# The tests' scripted models live on loopback: as their operator, the test run allows it to the servers it starts
# (which otherwise refuse a caller's loopback URL when they serve beyond this machine). tests/test_upstream_policy.py
# builds its policies explicitly.
os.environ.setdefault(setting_variable("upstream_allow"), "127.0.0.0/8,localhost")
# The servers the tests start keep their results in a directory of this run's, never the user's state directory.
if setting_variable("results_dir") not in os.environ:
    os.environ[setting_variable("results_dir")] = tempfile.mkdtemp(prefix="opencode-env-test-results-")
    atexit.register(shutil.rmtree, os.environ[setting_variable("results_dir")], True)

TIERS = ("unit", "contract", "smoke", "integration", "browser", "solo", "cluster")
"""The tests by tier, a directory each (./dev test names them):
- unit: no sandbox and no agent (pure functions, the proxy over loopback, settings, the import graph);
- contract: each seam's contract over every backend (the sandbox contract over local and both cloud fakes, the cloud
  lifecycle over an in-memory cloud);
- smoke: one real rollout end to end;
- integration: real rollouts, servers, clients and the cloud fakes, every path;
- browser: a real Chromium over the viewer and /web;
- solo: loads every core (sixteen rollouts at once, the audit of a whole dataset); a full run runs it after the
  rest, alone.
- cluster: a simulated Ray cluster (needs the ray extra); a full run runs it after solo, in one process.
The quick tier (`./dev test --quick`) is unit + contract + smoke, for the inner loop; the full suite is still the
gate. A new test file goes in the first tier whose description fits it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    live = {"e2b": ("E2B_API_KEY", "a live E2B account"), "hf": ("HF_TOKEN", "a Hugging Face token with Jobs access")}
    for marker, (variable, what) in live.items():
        if os.environ.get(variable):
            continue
        skip = pytest.mark.skip(reason=f"needs {what}: set {variable}")
        for item in items:
            if item.get_closest_marker(marker):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    binary = install_cached()
    _warm_npm_cache()
    return binary


def _warm_npm_cache() -> None:
    """An OpenCode installed before its npm cache was kept (older checkouts) fetches its packages into it once, so
    the run-time install tests can install offline. Workers of one run wait on the install lock."""
    cache = npm_cache()
    with (cache_root() / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cache.exists():
            return
        with tempfile.TemporaryDirectory() as prefix:
            package = f"{OPENCODE_PACKAGE}@{OPENCODE_VERSION}"
            staging = cache.with_name(".npm-cache-staging")
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run(
                ["npm", "install", "--no-fund", "--no-audit", "--cache", str(staging), "--prefix", prefix, package],
                capture_output=True,
                check=True,
                timeout=900,
            )
            staging.rename(cache)


@pytest.fixture(scope="session")
def sandbox_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandboxes")


@pytest.fixture(scope="session")
def backend(opencode_binary: Path, sandbox_base: Path) -> LocalBackend:
    return LocalBackend(cached_tools, base_dir=sandbox_base)


@pytest.fixture
async def box(backend: LocalBackend) -> AsyncIterator[LocalSandbox]:
    """A local sandbox of default spec, closed after the test."""
    sandbox = await backend.create(SandboxSpec())
    try:
        yield sandbox
    finally:
        await sandbox.close()


def processes_mentioning(*texts: str, settle_s: float = 5.0) -> list[str]:
    """Processes whose command line mentions one of `texts`, once the kernel has had a moment to finish killing:
    processes of a torn-down namespace exit asynchronously, so a leak is what is still there after `settle_s`.
    Every text names this run's own processes (its sandbox base directory, or `sleep_cmd`'s marked sleeps)."""
    deadline = time.monotonic() + settle_s
    while True:
        listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True).stdout
        found = [line for line in listing.splitlines() if any(text in line for text in texts) and "ps -eww" not in line]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture(scope="session")
def fake_cloud(sandbox_base: Path, opencode_binary: Path) -> FakeCloud:
    return FakeCloud(base_dir=sandbox_base)


def e2b_over(fake_cloud: FakeCloud) -> E2BBackend:
    """The E2B backend over the fake cloud (for a module fixture too, which cannot ask for `e2b_fake`)."""
    return E2BBackend(sandbox_class=fake_cloud.sandbox_class(), api_key=fake_cloud.api_key)


@pytest.fixture
def e2b_fake(fake_cloud: FakeCloud) -> E2BBackend:
    return e2b_over(fake_cloud)


@pytest.fixture(scope="session")
def hf_cloud(sandbox_base: Path, opencode_binary: Path) -> Iterator[FakeHfCloud]:
    cloud = FakeHfCloud(base_dir=sandbox_base)
    yield cloud
    cloud.kill_all()


@pytest.fixture
def hf_fake(hf_cloud: FakeHfCloud) -> HFBackend:
    return HFBackend(
        sandbox_class=hf_cloud.sandbox_class(), token=hf_cloud.token, image="opencode-env", tools_dir=FAKE_TOOLS_DIR
    )


@pytest.fixture(scope="session")
def leak_check(sandbox_base: Path, fake_cloud: FakeCloud, hf_cloud: FakeHfCloud) -> Callable[[], None]:
    """No sandbox directory, no process of any sandbox and no (fake) E2B or HF sandbox is left: `no_leaks` checks
    it after a test, and a module fixture whose one rollout several tests read calls it right after that rollout."""

    def check() -> None:
        assert fake_cloud.alive == {}
        assert hf_cloud.alive == {}
        assert list(sandbox_base.iterdir()) == []
        assert processes_mentioning(str(sandbox_base)) == []

    return check


@pytest.fixture
def no_leaks(leak_check: Callable[[], None]) -> Iterator[None]:
    """After the test: nothing of any sandbox is left (`leak_check`)."""
    yield
    leak_check()
