"""What it costs to turn a result into JSON: as an object (what an inline result in the MCP structured content is)
and as text, each done two ways, side by side. (OpenEnv's observation carried both until it answered by reference:
bench.answer_paths measures the bytes of every path now.)

    uv run python -m bench.answer_encoding [--runs 15]

Results: the latency backend's (4 turns, ~184 KB) and wire_format's synthetic 100-turn one. Object: pydantic's
`model_dump(mode="json")` against `model_dump_json()` parsed by orjson; text: the standard library's `json.dumps`
of the object against orjson's. The cases alternate within each run; medians in ms, ratio to the first way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable

import orjson

from bench.latency_backend import LatencyBackend
from bench.wire_format import synthetic
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import RolloutResult


def timed_ms(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000


def cases(result: RolloutResult) -> dict[str, Callable[[], object]]:
    as_object = result.model_dump(mode="json")
    return {
        "object: model_dump(mode=json)": lambda: result.model_dump(mode="json"),
        "object: model_dump_json + orjson.loads": lambda: orjson.loads(result.model_dump_json()),
        "text: json.dumps": lambda: json.dumps(as_object, allow_nan=False, separators=(",", ":")),
        "text: orjson.dumps": lambda: orjson.dumps(as_object).decode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with ScriptedModelServer(demo_script()) as model:  # probed before the rollout; the latency sandbox never calls it
        latency = asyncio.run(run_rollout(demo_request(model.base_url), LatencyBackend()))
    results = {"latency backend": latency, "100 turns": synthetic(100, start=10_000, growth=60, completion=40)}
    for name, result in results.items():
        work = cases(result)
        times: dict[str, list[float]] = {case: [] for case in work}
        for run in range(args.runs):
            order = list(work)[run % len(work) :] + list(work)[: run % len(work)]
            for case in order:
                times[case].append(timed_ms(work[case]))
        print(f"\n{name}: {len(result.model_dump_json()) / 1000:.0f} KB of JSON, medians of {args.runs} runs")
        medians = {case: statistics.median(values) for case, values in times.items()}
        for case, median in medians.items():
            base = medians["object: model_dump(mode=json)" if case.startswith("object") else "text: json.dumps"]
            print(f"  {case:<40} {median:8.2f} ms  ({median / base:.2f}x)")


if __name__ == "__main__":
    main()
