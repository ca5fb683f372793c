"""What an image costs a local sandbox: create + one command + close, side by side in one run.

`uv run python -m bench.image_start [--runs 20]` (as root, the base image built: `opencode-env image build-base`).
Interleaved, one of each per round:
- no image: the host's root, read-only (the backend without an image);
- cached image: the base image, already unpacked (id-mapped lower layer + the rollout's overlay);
- first use: the same image with its unpacked tree removed first, so it is unpacked again (podman image mount +
  copy), as the first rollout on a new image pays;
- podman run --rm IMAGE true: the reference, a container started by podman (runc) on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.stats import spread
from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.images.build.builder import containers_conf
from opencode_env.sandbox.local.images.store import HOST_IMAGE, ImageStore
from opencode_env.sandbox.local.tools import cached_tools


async def lifetime(backend: LocalBackend, image: str) -> float:
    started = time.perf_counter()
    sandbox = await backend.create(SandboxSpec(image=image))
    try:
        ran = await sandbox.run("true", timeout_s=60)
        assert ran.exit_code == 0, ran.stderr
    finally:
        await sandbox.close()
    return time.perf_counter() - started


async def podman_run(image: str) -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        "podman",
        "run",
        "--rm",
        "--network",
        "none",
        image,
        "true",
        env={**os.environ, "CONTAINERS_CONF": str(containers_conf())},
    )
    assert await process.wait() == 0
    return time.perf_counter() - started


async def main(runs: int) -> None:
    await cached_tools()
    image = build_base_image()
    # an image cache of its own: the first use removes the unpacked image, which the shared cache's users may hold
    with tempfile.TemporaryDirectory() as base, tempfile.TemporaryDirectory() as cache:
        unpacked = ImageStore(Path(cache) / "images").prepare(image).rootfs.parent
        backend = LocalBackend(cached_tools, base_dir=Path(base), cache_dir=Path(cache))
        host, cached, first, podman = [], [], [], []
        for _ in range(runs):
            host.append(await lifetime(backend, HOST_IMAGE))
            cached.append(await lifetime(backend, image))
            shutil.rmtree(unpacked)
            first.append(await lifetime(backend, image))
            podman.append(await podman_run(image))
    rows = [("no image (host root)", host), ("cached image", cached), ("first use of an image", first)]
    rows.append(("podman run --rm IMAGE true", podman))
    print(f"sandbox create + one command + close, {runs} runs each, interleaved ({image})")
    for name, values in rows:
        print(f"  {name:28} {spread(values)}")
    base_p50 = statistics.median(host)
    print(
        f"  cached image adds {1000 * (statistics.median(cached) - base_p50):+.1f} ms at p50 "
        f"({statistics.median(cached) / base_p50:.2f}x); podman run is {statistics.median(podman) / base_p50:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
