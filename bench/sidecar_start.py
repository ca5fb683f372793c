"""What a sidecar costs a local sandbox: create + one command + close, side by side in one run.

`uv run python -m bench.sidecar_start [--runs 10]` (as root, the base image built). Interleaved, one of each per
round, all on the base image (already unpacked):
- alone: the sandbox without services;
- one sidecar: started in its network (its own sandbox), its command launched, nothing waited for;
- one healthy sidecar: the same with a healthcheck the sandbox waits for (an HTTP server's first answer).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.stats import spread
from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.wire.services import HealthCheck, Service


def services(image: str) -> dict[str, tuple[Service, ...]]:
    server = ["python3", "-m", "http.server", "8090", "--bind", "127.0.0.1"]
    check = HealthCheck(test=["curl", "-sf", "--noproxy", "*", "http://127.0.0.1:8090/"], interval_s=0.1, retries=600)
    return {
        "alone": (),
        "one sidecar": (Service(name="web", image=image, command=server, workdir="/srv"),),
        "one healthy sidecar": (
            Service(
                name="web", image=image, command=server, workdir="/srv", healthcheck=check, awaited="service_healthy"
            ),
        ),
    }


async def lifetime(backend: LocalBackend, image: str, sidecars: tuple[Service, ...]) -> float:
    started = time.perf_counter()
    sandbox = await backend.create(SandboxSpec(image=image, services=sidecars))
    try:
        ran = await sandbox.run("true", timeout_s=60)
        assert ran.exit_code == 0, ran.stderr
    finally:
        await sandbox.close()
    return time.perf_counter() - started


async def main(runs: int) -> None:
    await cached_tools()
    image = build_base_image()
    cases = services(image)
    with tempfile.TemporaryDirectory() as base:
        backend = LocalBackend(cached_tools, base_dir=Path(base))
        await lifetime(backend, image, ())
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):
            for name, sidecars in cases.items():
                times[name].append(await lifetime(backend, image, sidecars))
    alone = statistics.median(times["alone"])
    for name, values in times.items():
        print(f"{name:22} {spread(values)}  x{statistics.median(values) / alone:.2f} of alone")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))
