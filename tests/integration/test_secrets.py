"""A recognisable upstream key, searched for in everything a rollout produces while and after it runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from opencode_env.client.client import OpenCodeEnv
from opencode_env.sandbox.base import Preflight, SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, say, write
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.wire import Mode
from tests.server_app import app_for

CANARY = "sk-canary-7f3a9c1e5b2d"


class ScanningBackend:
    """The local backend, reading every file of each sandbox for the key just before the sandbox is deleted."""

    name = "local"

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.hits: list[str] = []

    async def close_all(self) -> int:
        return await self.inner.close_all()

    async def preflight(self) -> Preflight:
        return await self.inner.preflight()

    def preflight_verdict(self) -> Preflight:
        return self.inner.preflight_verdict()

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        sandbox = await self.inner.create(spec)
        close = sandbox.close

        async def scan_then_close() -> None:
            # Every file of the rollout's tree (the mounted file system, the control and proxy dirs); the disk
            # image itself is the file system's backing store, read through its mount instead.
            for path in sandbox.root.rglob("*"):
                if path == sandbox.layout.disk_image or not path.is_file() or path.is_symlink():
                    continue
                if CANARY.encode() in path.read_bytes():
                    self.hits.append(str(path.relative_to(sandbox.root)))
            await close()

        sandbox.close = scan_then_close  # type: ignore[method-assign]
        return sandbox


class ArgvWatch:
    """Reads every process's command line on the machine, over and over, while a rollout runs."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._scan, daemon=True)

    def _scan(self) -> None:
        while not self._stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    if CANARY.encode() in cmdline.read_bytes():
                        self.hits.append(str(cmdline))
                except OSError:
                    continue
            self._stop.wait(0.02)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def scanning(backend: LocalBackend) -> Iterator[tuple[str, ScanningBackend]]:
    scanner = ScanningBackend(backend)
    server = ThreadedServer(app_for(scanner))  # type: ignore[arg-type]
    server.start()
    yield server.url, scanner
    server.stop()


@pytest.mark.parametrize("mode", ["transparent_proxy", "black_box"])
async def test_the_key_appears_in_no_output(
    scanning: tuple[str, ScanningBackend], mode: Mode, caplog: pytest.LogCaptureFixture, no_leaks: None
) -> None:
    url, scanner = scanning
    caplog.set_level(logging.DEBUG)
    looks = "env | sort; tr '\\\\0' ' ' < /proc/self/cmdline; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\\\0' ' '"
    steps = [write("/home/user/workdir/notes.txt", "hello"), say("done")]
    if mode == "transparent_proxy":
        steps.insert(0, bash(looks, "Look around"))
    with ScriptedModelServer(Script(steps=steps)) as model, ArgvWatch() as argv:
        async with OpenCodeEnv(url) as env:
            result = await env.run_rollout(demo_request(model.base_url, api_key=CANARY, mode=mode))
    assert result.status == "completed", result.error
    assert model.exchanges[0].headers["authorization"] == f"Bearer {CANARY}"
    assert CANARY not in result.model_dump_json()
    assert argv.hits == []
    assert CANARY not in caplog.text
    assert scanner.hits == []
    if mode == "transparent_proxy":
        assert "PATH=" in result.proxy_turns[1].request["messages"][-1]["content"]
