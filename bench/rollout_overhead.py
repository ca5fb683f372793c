"""The demo task as a full rollout vs the bare `opencode run` of the same script, side by side in one run.

    uv run python -m bench.rollout_overhead [--runs 5]

Each repetition runs the bare agent, a black_box rollout, a transparent_proxy rollout and one whose OpenCode finds
no provisioned plugin (the path before it was), each against a fresh scripted model, interleaved so that machine
noise falls on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

from bench.opencode_body import bare_opencode_run
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import ProvidedTools
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools, install_cached
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import Mode, RolloutResult

PHASES = ("sandbox_s", "install_s", "prepare_s", "setup_s", "proxy_s", "agent_s", "verify_s", "collect_s", "close_s")


def bare() -> float:
    with ScriptedModelServer(demo_script()) as model:
        return bare_opencode_run(model.base_url)


def rollout(backend: LocalBackend, mode: Mode) -> tuple[float, RolloutResult]:
    with ScriptedModelServer(demo_script()) as model:
        started = time.perf_counter()
        result = asyncio.run(run_rollout(demo_request(model.base_url, mode=mode), backend))
        elapsed = time.perf_counter() - started
    if result.status != "completed" or result.reward != 1.0:
        raise RuntimeError(f"the {mode} rollout did not complete: {result.status} {result.error}")
    return elapsed, result


async def tools_fetching_the_plugin() -> ProvidedTools:
    """The cached tools without the provisioned config directory: OpenCode tries its npm install at every start
    (as before `@opencode-ai/plugin` was provisioned); here the egress proxy refuses the registry at once, so this
    is the cheapest form of that attempt, not the online cost of a download."""
    return dataclasses.replace(await cached_tools(), opencode_config_deps=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    install_cached()
    backend, fetching = LocalBackend(cached_tools), LocalBackend(tools_fetching_the_plugin)
    paths: dict[str, tuple[LocalBackend, Mode]] = {
        "black_box rollout": (backend, "black_box"),
        "transparent_proxy rollout": (backend, "transparent_proxy"),
        "proxy, plugin fetched": (fetching, "transparent_proxy"),
    }
    bare()
    for path_backend, mode in paths.values():
        rollout(path_backend, mode)
    walls: dict[str, list[float]] = {"bare opencode run": [], **{name: [] for name in paths}}
    phases: dict[str, dict[str, list[float]]] = {name: {} for name in paths}
    for _ in range(args.runs):
        walls["bare opencode run"].append(bare())
        for name, (path_backend, mode) in paths.items():
            elapsed, result = rollout(path_backend, mode)
            walls[name].append(elapsed)
            for phase in PHASES:
                value = getattr(result.timings, phase)
                if value is not None:
                    phases[name].setdefault(phase, []).append(value)
    baseline = statistics.median(walls["bare opencode run"])
    print(f"demo task, {args.runs} interleaved repetitions (median wall seconds)")
    print(f"{'path':<28}{'median':>9}{'min':>9}{'ratio':>9}{'added':>9}")
    for name, values in walls.items():
        median = statistics.median(values)
        print(f"{name:<28}{median:>9.3f}{min(values):>9.3f}{median / baseline:>8.3f}x{median - baseline:>+9.3f}")
    for name, by_phase in phases.items():
        summary = ", ".join(f"{phase[:-2]} {statistics.median(values):.3f}" for phase, values in by_phase.items())
        print(f"{name} phases (median s): {summary}")


if __name__ == "__main__":
    main()
