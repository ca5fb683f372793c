"""The server's memory over model-driven rollouts: the real server (`server.app`, local backend) in a process of its
own, N rollouts through it one after another, each the real OpenCode driven by the scripted model (one bash step
and an answer); the server's RSS printed at 0, N/2 and N rollouts (and after each), and with --trace the Python
allocations that grew most between N/2 and N (tracemalloc in the server), and malloc's own bytes in use against
bytes held (native memory too: pydantic-core's, OpenSSL's, which tracemalloc does not see).

    python -m bench.server_memory [N] [--trace]
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys
import tempfile
import tracemalloc
from pathlib import Path

from opencode_env import OpenCodeEnv
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, say

TRACE_FRAMES = 8


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _listening(port: int, timeout_s: float = 300.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        writer.close()
        return


def _rss_parts(pid: int) -> str:
    """RSS split as the kernel counts it: anonymous (the heap), file-backed (mapped libraries and files), shared."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    names = ("RssAnon", "RssFile", "RssShmem")
    return ", ".join(f"{name} {int(fields[name].split()[0]) / 1024:.0f} MB" for name in names)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _malloc_in_use() -> str:
    """glibc's own count: bytes malloc has handed out and not had back, against what it holds from the system."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    held = info.arena + info.hblkhd
    return f"in use {(info.uordblks + info.hblkhd) / 2**20:.0f} MB of {held / 2**20:.0f} MB held"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _serve(dump: str) -> None:
    """The server; the first SIGUSR1 starts tracemalloc (tracing from the start would slow every import), each later
    one writes the allocations that grew most since the one before to `dump`."""
    from opencode_env.server.app import main

    previous: list[tracemalloc.Snapshot] = []

    def snapshot(_signal: int, _frame: object) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(TRACE_FRAMES)
        current = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if previous:
            stats = current.compare_to(previous[0], "traceback")[:10]
            with open(dump, "a") as out:
                for stat in stats:
                    out.write(f"{stat.size_diff / 2**20:+.1f} MiB in {stat.count_diff:+d} blocks\n")
                    out.write("".join(f"    {line}\n" for line in stat.traceback.format()[-TRACE_FRAMES * 2 :]))
        previous[:] = [current]

    def heap_report(_signal: int, _frame: object) -> None:
        with open(dump + ".malloc", "a") as out:
            out.write(_malloc_in_use() + "\n")

    signal.signal(signal.SIGUSR1, snapshot)
    signal.signal(signal.SIGUSR2, heap_report)
    main(host="127.0.0.1")


async def _run(count: int, trace: bool) -> dict[int, float]:
    with tempfile.TemporaryDirectory() as scratch:
        return await _measure(count, trace, Path(scratch) / "growth.txt")


async def _measure(count: int, trace: bool, dump: Path) -> dict[int, float]:
    port = _free_port()
    script = Script(steps=[bash("echo hello > hello.txt", "write a file"), say("done")])
    with ScriptedModelServer(script) as model:
        env = {
            **os.environ,
            "PORT": str(port),
            "OPENCODE_ENV_BACKEND": "local",
            "OPENCODE_ENV_UPSTREAM_ALLOW": f"127.0.0.1:{model.port}",
        }
        argv = [sys.executable, "-m", "bench.server_memory", "--serve", str(dump)]
        server = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            await _listening(port)
            async with OpenCodeEnv(f"http://127.0.0.1:{port}", ready_timeout_s=300) as client:
                if trace:
                    server.send_signal(signal.SIGUSR1)
                    await asyncio.sleep(2)
                marks = {0: _rss_mb(server.pid)}
                for done in range(1, count + 1):
                    result = await client.run_rollout(
                        instruction="Write hello.txt.", base_url=model.base_url, model="scripted", endpoint="vllm"
                    )
                    if result.status != "completed":
                        why = f"{result.status} {result.error}"
                        raise SystemExit(f"rollout {done} did not complete, nothing to measure: {why}")
                    if trace and done in (count // 2, count):
                        server.send_signal(signal.SIGUSR1)
                        await asyncio.sleep(2)
                    marks[done] = _rss_mb(server.pid)
                    server.send_signal(signal.SIGUSR2)
                parts = _rss_parts(server.pid)
        finally:
            server.terminate()
            await asyncio.wait_for(server.wait(), 60)
    half = count // 2
    points = f"{marks[0]:.0f} / {marks[half]:.0f} / {marks[count]:.0f} MB"
    print(f"RSS after 0 / {half} / {count} rollouts: {points}")
    print(f"    after each: {' '.join(f'{rss:.0f}' for rss in marks.values())}; at the end {parts}")
    print(
        f"    per rollout: first half {(marks[half] - marks[0]) / max(half, 1):.1f} MB, second half "
        f"{(marks[count] - marks[half]) / max(count - half, 1):.1f} MB"
    )
    malloc = await asyncio.to_thread(_lines, Path(str(dump) + ".malloc"))
    print(f"    malloc after each: {'; '.join(malloc)}")
    growth = await asyncio.to_thread(_lines, dump) if trace else []
    if growth:
        print("largest growth between N/2 and N (tracemalloc):")
        print("\n".join(growth))
    return marks


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2])
        return
    args = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    asyncio.run(_run(int(args[0]) if args else 6, "--trace" in sys.argv))


if __name__ == "__main__":
    main()
