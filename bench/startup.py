"""Start-up cost, side by side: the client import, the server's time to a first /health answer and the capture
proxy's to its first /healthz (and its CPU until then: every rollout starts one), with the bytecode as installed
and with none at all (an empty PYTHONPYCACHEPREFIX hides every .pyc file), for this tree and, with --baseline,
another checkout of the project run on the same virtualenv.

    uv run python -m bench.startup [--runs 3] [--baseline DIR]

    # a baseline tree without touching the repository:
    mkdir /tmp/base && git archive a51fee7 | tar -x -C /tmp/base && python -m compileall -q /tmp/base

Every measurement is a fresh interpreter (its start included); the cases alternate within each run so that machine
noise falls on all of them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLIENT_IMPORT = """
import json, sys, time
started = time.perf_counter()
from opencode_env import OpenCodeEnv
OpenCodeEnv
elapsed = time.perf_counter() - started
heavy = ["gradio", "pandas", "opencode_env.rollout.pipeline", "opencode_env.rollout.proxy_session",
         "opencode_env.rollout.opencode"]
print(json.dumps({"s": elapsed, "modules": len(sys.modules), "heavy": [m for m in heavy if m in sys.modules]}))
"""


@dataclass
class Case:
    tree: Path
    label: str
    no_bytecode: bool
    imports: list[float] = field(default_factory=list)
    modules: int = 0
    heavy: list[str] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)
    proxy_health: list[float] = field(default_factory=list)
    proxy_cpu: list[float] = field(default_factory=list)

    def environment(self, empty_cache: str) -> dict[str, str]:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(self.tree)}
        env.pop("PYTHONPYCACHEPREFIX", None)
        if self.no_bytecode:
            env["PYTHONPYCACHEPREFIX"] = empty_cache
        return env


def measure_import(case: Case, empty_cache: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", CLIENT_IMPORT],
        env=case.environment(empty_cache),
        cwd=case.tree,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(completed.stdout)
    case.imports.append(report["s"])
    case.modules, case.heavy = report["modules"], report["heavy"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def measure_health(case: Case, empty_cache: str) -> None:
    port = _free_port()
    env = {**case.environment(empty_cache), "HOST": "127.0.0.1", "PORT": str(port), "OPENCODE_ENV_BACKEND": "local"}
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "opencode_env.server.app"],
        env=env,
        cwd=case.tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        case.health.append(_first_200(f"http://127.0.0.1:{port}/health", started))
        # Ready: the app is built and serves the rest (the staged app answers /health before that).
        case.ready.append(_first_200(f"http://127.0.0.1:{port}/metadata", started))
    finally:
        server.terminate()
        server.wait(timeout=60)


def measure_proxy(case: Case, empty_cache: str) -> None:
    """The capture proxy (started once per rollout): time to its first /healthz answer and its CPU until then."""
    with tempfile.TemporaryDirectory() as scratch:
        port_file = Path(scratch) / "port"
        started = time.perf_counter()
        arguments = ["--upstream-url", "http://127.0.0.1:9/v1", "--port", "0", "--port-file", str(port_file)]
        proxy = subprocess.Popen(
            [sys.executable, "-m", "opencode_env.proxy", *arguments, "--trace", str(Path(scratch) / "trace.jsonl")],
            env=case.environment(empty_cache),
            cwd=case.tree,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not port_file.exists():
                time.sleep(0.002)
            case.proxy_health.append(_first_200(f"http://127.0.0.1:{port_file.read_text()}/healthz", started))
            tasks = Path(f"/proc/{proxy.pid}/task")
            case.proxy_cpu.append(sum(int((t / "schedstat").read_text().split()[0]) for t in tasks.iterdir()) / 1e9)
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)


def _first_200(url: str, started: float) -> float:
    while time.perf_counter() - started < 120:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not answer 200 within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout of the project to measure alongside")
    args = parser.parse_args()
    trees = [(ROOT, "this tree")] + ([(args.baseline.resolve(), "baseline")] if args.baseline else [])
    cases = [
        Case(tree, f"{name}, {mode}", mode == "no bytecode")
        for tree, name in trees
        for mode in ("bytecode", "no bytecode")
    ]
    with tempfile.TemporaryDirectory() as empty_cache:
        for _ in range(args.runs):
            for case in cases:
                measure_import(case, empty_cache)
                measure_health(case, empty_cache)
                measure_proxy(case, empty_cache)
    base = cases[0]
    for case in cases:
        imported, healthy, ready = (statistics.median(v) for v in (case.imports, case.health, case.ready))
        print(
            f"{case.label:>26}: client import {imported:5.2f}s ({imported / statistics.median(base.imports):5.1f}x), "
            f"{case.modules} modules, heavy: {', '.join(case.heavy) or 'none'}; "
            f"/health {healthy:5.2f}s ({healthy / statistics.median(base.health):4.1f}x); "
            f"ready {ready:5.2f}s ({ready / statistics.median(base.ready):4.1f}x)"
        )
    for case in cases:
        healthy, cpu = statistics.median(case.proxy_health), statistics.median(case.proxy_cpu)
        print(
            f"{case.label:>26}: capture proxy /healthz {healthy:5.2f}s "
            f"({healthy / statistics.median(base.proxy_health):4.1f}x), CPU until then {cpu:5.2f}s "
            f"({cpu / statistics.median(base.proxy_cpu):4.1f}x)"
        )


if __name__ == "__main__":
    main()
