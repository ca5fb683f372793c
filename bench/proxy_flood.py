"""A flood of large calls through the real capture proxy, unbounded and bounded as a rollout of `--disk-mb` bounds it,
side by side in one run against the scripted model on loopback: what each answered, the size of its trace, the
turns it kept and left out, and the time per call.

    uv run python -m bench.proxy_flood [--calls 20] [--sizes 4000000,1000000] [--disk-mb 64]

Each call's one message is new (nothing to compact by reference to an earlier turn), so every byte is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from opencode_env.sandbox.base import proxy_file_bytes
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, say
from opencode_env.testing.proxy_process import running_proxy
from opencode_env.wire import parse_trace

VLLM = ("--endpoint-kind", "vllm", "--model-override", "scripted-policy")


@dataclass(frozen=True)
class Flood:
    answered: int
    trace_bytes: int
    kept: int
    left_out: int
    ms_per_call: float


async def flood(max_file_bytes: int, calls: int, size: int) -> Flood:
    script = Script(steps=[say(f"answer {index}") for index in range(calls)])
    with tempfile.TemporaryDirectory(prefix="proxy-flood-") as directory:
        bound = ("--max-file-bytes", str(max_file_bytes)) if max_file_bytes else ()
        with (
            ScriptedModelServer(script) as model,
            running_proxy(model.base_url, Path(directory), *VLLM, *bound) as proxy,
        ):
            answered, started = 0, time.monotonic()
            async with httpx.AsyncClient(timeout=120) as client:
                for index in range(calls):
                    body = {"model": "policy", "messages": [{"role": "user", "content": f"{index} " + "x" * size}]}
                    headers = {"authorization": "Bearer sk-agent-side"}
                    answer = await client.post(f"{proxy.url}/chat/completions", json=body, headers=headers)
                    answered += answer.status_code == 200
            elapsed = time.monotonic() - started
            proxy.process.terminate()
            proxy.process.wait(timeout=15)
            trace = parse_trace(proxy.trace_path.read_text())
            return Flood(
                answered,
                proxy.trace_path.stat().st_size,
                len(trace.turns),
                trace.budget.dropped if trace.budget else 0,
                elapsed / calls * 1000,
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sizes", default="4000000,1000000")
    parser.add_argument("--disk-mb", type=int, default=64)
    args = parser.parse_args()
    bound = proxy_file_bytes(args.disk_mb)
    print(f"bound for disk_mb={args.disk_mb}: {bound / 2**20:.1f} MiB per file")
    for size in map(int, args.sizes.split(",")):
        unbounded, bounded = await flood(0, args.calls, size), await flood(bound, args.calls, size)
        for label, run in (("unbounded", unbounded), ("bounded", bounded)):
            print(
                f"{args.calls} x {size / 1e6:.1f} MB {label:9}: answered {run.answered}/{args.calls}, trace "
                f"{run.trace_bytes / 2**20:6.1f} MiB, turns kept {run.kept}, left out {run.left_out}, "
                f"{run.ms_per_call:.0f} ms/call"
            )
        print(
            f"  ratio bounded/unbounded: trace {bounded.trace_bytes / unbounded.trace_bytes:.3f}, "
            f"time per call {bounded.ms_per_call / unbounded.ms_per_call:.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
