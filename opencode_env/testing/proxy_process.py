"""The capture proxy as a real subprocess, for tests and benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opencode_env.wire import Trace, parse_trace


@dataclass
class ProxyProcess:
    url: str
    trace_path: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    def trace(self) -> Trace:
        """The trace so far (none yet while the proxy is still starting: it writes its port file first)."""
        return parse_trace(self.trace_path.read_text() if self.trace_path.exists() else "")

    def wait_for_turns(self, count: int, timeout_s: float = 10.0) -> Trace:
        return self.wait_for(lambda trace: len(trace.turns) >= count, timeout_s)

    def wait_for(self, done: Callable[[Trace], bool], timeout_s: float = 10.0) -> Trace:
        """The trace once `done` holds for it, or as it is when `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            trace = self.trace()
            if done(trace) or time.monotonic() > deadline:
                return trace
            time.sleep(0.02)


@contextmanager
def running_proxy(
    upstream_url: str,
    directory: Path,
    *args: str,
    key: str = "sk-upstream-test",
    env: Mapping[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> Iterator[ProxyProcess]:
    """The proxy with `args`, its own variables plus `env`, inheriting `pass_fds` (e.g. a socket table to read)."""
    port_file, trace, log = directory / "port", directory / "trace.jsonl", directory / "proxy.log"
    env = {"PATH": os.environ["PATH"], "OPENCODE_ENV_UPSTREAM_KEY": key, **(env or {})}
    command = [
        sys.executable,
        "-m",
        "opencode_env.proxy",
        "--upstream-url",
        upstream_url,
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--trace",
        str(trace),
        *args,
    ]
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, pass_fds=pass_fds)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start: {log.read_text()}")
            time.sleep(0.01)
        yield ProxyProcess(f"http://127.0.0.1:{port_file.read_text()}/v1", trace, log, process)
    finally:
        process.terminate()
        process.wait(timeout=15)
