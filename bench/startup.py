"""Start-up cost, side by side: the client import and the server's time to a first /health answer, each with the
bytecode as installed and with no bytecode at all (an empty PYTHONPYCACHEPREFIX hides the installed .pyc files).

    uv run python -m bench.startup [--runs 3]

Every measurement is a fresh interpreter, so the figures include interpreter start; runs alternate between the two
cases so that machine noise falls on both alike.
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

import httpx

CLIENT_IMPORT = """
import json, sys, time
started = time.perf_counter()
from opencode_env import OpenCodeEnv
OpenCodeEnv
elapsed = time.perf_counter() - started
heavy = ["gradio", "pandas", "opencode_env.rollout", "opencode_env.proxy_session", "opencode_env.opencode"]
print(json.dumps({"s": elapsed, "modules": len(sys.modules), "heavy": [m for m in heavy if m in sys.modules]}))
"""


def _environment(no_bytecode: bool, cache_dir: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if no_bytecode:
        env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def client_import(no_bytecode: bool, cache_dir: str) -> tuple[float, float, int, list[str]]:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", CLIENT_IMPORT],
        env=_environment(no_bytecode, cache_dir),
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    report = json.loads(completed.stdout)
    return wall, report["s"], report["modules"], report["heavy"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def health_after_start(no_bytecode: bool, cache_dir: str) -> float:
    port = _free_port()
    env = {**_environment(no_bytecode, cache_dir), "HOST": "127.0.0.1", "PORT": str(port)}
    env["OPENCODE_ENV_BACKEND"] = "local"
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "server.app"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while time.perf_counter() - started < 120:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                time.sleep(0.02)
        raise RuntimeError("the server did not answer /health within 120 s")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    imports: dict[bool, list[tuple[float, float, int, list[str]]]] = {False: [], True: []}
    health: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as empty_cache:
        for _ in range(args.runs):
            for no_bytecode in (False, True):
                imports[no_bytecode].append(client_import(no_bytecode, empty_cache))
                health[no_bytecode].append(health_after_start(no_bytecode, empty_cache))
    import_s = {case: statistics.median(r[1] for r in runs) for case, runs in imports.items()}
    health_s = {case: statistics.median(values) for case, values in health.items()}
    for no_bytecode, label in ((False, "bytecode as installed"), (True, "no bytecode")):
        first = imports[no_bytecode][0]
        print(
            f"{label:>22}: `from opencode_env import OpenCodeEnv` median {import_s[no_bytecode]:.2f}s "
            f"(process {statistics.median(r[0] for r in imports[no_bytecode]):.2f}s, {first[2]} modules, heavy: "
            f"{', '.join(first[3]) or 'none'}); /health after start median {health_s[no_bytecode]:.2f}s"
        )
    print(
        f"ratio no-bytecode / installed: import {import_s[True] / import_s[False]:.2f}x, "
        f"/health {health_s[True] / health_s[False]:.2f}x"
    )


if __name__ == "__main__":
    main()
