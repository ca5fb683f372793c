"""What building a task image in the box costs: a small image (FROM the base image, one RUN step) built cold by the
host's podman as root (as before) and in the box (now), a cached rebuild (its content's tag present), and the first
build in a new box (its base image copied into its store once), side by side in one run. Needs podman and the base
image (`opencode-env image build-base`)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from opencode_env.sandbox.local.images.build.box import DEFAULT_ROOT, BuildBox
from opencode_env.sandbox.local.images.build.builder import ImageBuilder, containers_conf
from opencode_env.sandbox.local.images.store import BASE_IMAGE

ROUNDS = 3


def _context(root: Path) -> Path:
    context = root / f"ctx-{uuid.uuid4().hex[:8]}"
    context.mkdir()
    nonce = uuid.uuid4().hex
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\nRUN echo {nonce} > /app/built.txt\n")
    return context


def _host_cold(root: Path) -> float:
    context = _context(root)
    tag = f"localhost/opencode-env-bench/host:{context.name}"
    started = time.perf_counter()
    argv = ["podman", "build", "--pull=never", "--network", "host", "-t", tag, "--", str(context)]
    subprocess.run(argv, check=True, capture_output=True, env={"CONTAINERS_CONF": str(containers_conf())})
    elapsed = time.perf_counter() - started
    subprocess.run(["podman", "rmi", "--", tag], check=True, capture_output=True)
    return elapsed


def _box(root: Path, builder: ImageBuilder) -> tuple[float, float]:
    context = _context(root)
    started = time.perf_counter()
    built = builder.build(context, name="bench-box", timeout_s=600)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    assert builder.build(context, name="bench-box", timeout_s=600).cached
    cached = time.perf_counter() - started
    subprocess.run(["podman", "rmi", "--", built.ref], check=True, capture_output=True)
    return cold, cached


def _new_box(root: Path) -> float:
    box_root = DEFAULT_ROOT.parent / f"bench-box-{os.getpid()}"
    try:
        return _box(root, ImageBuilder(box_root=box_root))[0]
    finally:
        BuildBox(box_root, "podman").remove()


def main() -> None:
    builder = ImageBuilder()
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        _box(root, builder)  # the box exists and holds the base image from here on
        host = [_host_cold(root) for _ in range(ROUNDS)]
        box = [_box(root, builder) for _ in range(ROUNDS)]
        first = _new_box(root)
    host_cold = min(host)
    box_cold = min(cold for cold, _ in box)
    box_cached = min(cached for _, cached in box)
    print(f"cold build, host podman as root: {host_cold:6.2f} s")
    print(f"cold build, in the box:          {box_cold:6.2f} s  ({box_cold / host_cold:.1f}x)")
    print(f"cached rebuild (tag present):    {box_cached:6.2f} s  (same path before and after)")
    print(f"first build in a new box:        {first:6.2f} s  (its base image copied into the box once)")


if __name__ == "__main__":
    main()
