"""How many generated agent tokens reach a usable sample, token-in off against auto, on the same runs.

`uv run python -m bench.coverage [--runs 3] [--turns 8] [--server forwarded]` (as root). Each run is one rollout on
the local backend with the real OpenCode against the scripted model, whose chat template drops earlier reasoning from
the history (as Qwen3's and most thinking models' do): every turn thinks, then calls a tool; the last one answers.
`--server` is the kind of server the scripted model plays: `forwarded` (stock vLLM: its chat route takes forwarded
prompt ids), `token-route` (prime-rl's /v1/chat/completions/tokens) or `neither`. The two modes
run interleaved with the same script; printed side by side: the share of agent tokens in the TRL row, in the
training sequences, in the step-wise samples, the sequences per rollout, and the agent phase's seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import forget_probes
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, ToolCallStep
from opencode_env.training.sequences import training_summary
from opencode_env.wire import TokenIn

SHARES = ("trl row", "sequences", "steps")


def thinking_script(turns: int) -> Script:
    steps = [
        Step(
            reasoning=f"Step {n}: I should look at the work dir again and count what is there before going on.",
            tool_calls=[ToolCallStep(name="bash", arguments={"command": f"ls -la /home/user/workdir # {n}"})],
        )
        for n in range(turns - 1)
    ]
    return Script(steps=[*steps, Step(reasoning="That is all.", content="Done: listed the work dir.")])


SERVERS: dict[str, dict[str, Any]] = {
    "forwarded": {"forwarded_ids": "on"},
    "token-route": {"token_routes": True},
    "neither": {},
}


async def one(backend: LocalBackend, script: Script, token_in: TokenIn, server: str) -> dict[str, float]:
    forget_probes()
    with ScriptedModelServer(script, **SERVERS[server]) as model:
        request = demo_request(model.base_url, token_in=token_in, verify=[], agent_timeout_s=1800.0)
        result = await run_rollout(request, backend)
    if result.status != "completed":
        raise SystemExit(f"{token_in}: {result.status}: {result.error}")
    summary = training_summary(result)
    assert summary.coverage is not None
    shares = {
        name: part.covered_tokens / part.agent_tokens
        for name, part in zip(
            SHARES, (summary.coverage.trl_row, summary.coverage.sequences, summary.coverage.steps), strict=True
        )
    }
    row = summary.coverage.trl_row
    print(f"  token_in={token_in}: trl row {row.text()}; warnings: {len(result.warnings)}", flush=True)
    return {**shares, "sequences per rollout": summary.sequences, "agent s": result.timings.agent_s or 0.0}


async def main(runs: int, turns: int, server: str) -> None:
    script = thinking_script(turns)
    with tempfile.TemporaryDirectory() as base:
        backend = LocalBackend(cached_tools, base_dir=Path(base))
        rows: dict[str, list[dict[str, float]]] = {"off": [], "auto": []}
        for _ in range(runs):
            for mode in ("off", "auto"):
                rows[mode].append(await one(backend, script, mode, server))
        await backend.close_all()
    print(f"{runs} rollouts per mode, {turns} agent turns each (thinking template drops earlier reasoning), {server}")
    print(f"{'':24}{'token_in=off':>16}{'token_in=auto':>16}")
    for key in rows["off"][0]:
        off, auto = (statistics.median(row[key] for row in rows[mode]) for mode in ("off", "auto"))
        shown = (f"{off:.1%}", f"{auto:.1%}") if key in SHARES else (f"{off:.3g}", f"{auto:.3g}")
        print(f"{key:24}{shown[0]:>16}{shown[1]:>16}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--server", choices=list(SERVERS), default="forwarded")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.turns, arguments.server))
