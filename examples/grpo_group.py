"""One GRPO group: 8 rollouts of one task on a runner, then rewards, training sequences and forks.

    opencode-env serve &
    python examples/grpo_group.py --base-url http://GPU-HOST:8000/v1 --model Qwen/Qwen3-8B
    python examples/grpo_group.py --scripted       # the built-in scripted model; its first reply "thinks", and
                                                   # its chat template drops earlier reasoning, like Qwen3's
    python examples/grpo_group.py --scripted --in-process   # no server: the local backend in this process
    python examples/grpo_group.py --ray auto ...   # on a Ray cluster (the ray extra; docs/cluster.md)

The group runs on a runner (a server, this process or a Ray cluster): the same call on each.

Prints one line per rollout and the shape of the TRL batch the group makes (see opencode_env/formats.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from opencode_env import InProcess, OpenCodeEnv, RolloutRequest, RolloutResult
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.scripted.script import Script, Step, ToolCallStep, bash, say
from opencode_env.training.formats import rollout_reward, trl_batch
from opencode_env.training.sequences import training_sequences, training_summary
from opencode_env.wire import Runner

SOLUTION = "def add(a, b):\n    return a + b\n"


def thinking_script() -> Script:
    write = ToolCallStep(name="write", arguments={"filePath": "/home/user/workdir/add.py", "content": SOLUTION})
    return Script(
        steps=[
            Step(reasoning="The task wants add(a, b); write it, then check it.", tool_calls=[write]),
            bash("cd /home/user/workdir && python3 -c 'from add import add; print(add(2, 3))'", "Check add"),
            say("add.py is written and add(2, 3) is 5."),
        ]
    )


@contextlib.contextmanager
def model_endpoint(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if not args.scripted:
        yield args.base_url, args.model
        return
    from opencode_env.scripted.model import ScriptedModelServer  # the server extra's web stack: only here

    with ScriptedModelServer(thinking_script()) as scripted:
        yield scripted.base_url, "scripted-policy"


def describe(index: int, result: RolloutResult) -> str:
    found = training_sequences(result)
    forks = ", ".join(f"turn {f.turn} at {f.position} ({f.cause})" for f in found.forks) or "none"
    final = found.final()
    tokens = f"{sum(final.env_mask)} model + {final.env_mask.count(0)} env tokens" if final else "no sequence"
    return (
        f"rollout {index}: {result.status:<14} reward {result.reward}  sequences {len(found.sequences)}  "
        f"final: {tokens}  forks: {forks}" + (f"  ({found.no_sequences_reason})" if found.no_sequences_reason else "")
    )


async def open_runner(args: argparse.Namespace) -> Runner:
    if args.ray:
        from opencode_env.cluster import RayRollouts

        cluster = RayRollouts(args.ray)
        await cluster.start()
        return cluster
    if args.in_process:
        return InProcess()
    # Connecting first fails at once, saying what to start, when no server listens there.
    async with OpenCodeEnv(base_url=args.server):
        pass
    return OpenCodeEnv(base_url=args.server)


async def run_group(args: argparse.Namespace, request: RolloutRequest) -> list[RolloutResult]:
    runner = await open_runner(args)
    try:
        return await runner.run_rollouts([request] * args.size, max_concurrency=4, progress=False)
    finally:
        await runner.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="http://localhost:8000")
    parser.add_argument("--in-process", action="store_true", help="run on the local backend in this process")
    parser.add_argument("--ray", default=None, metavar="ADDRESS", help="run on this Ray cluster ('auto')")
    parser.add_argument("--base-url", default="")
    parser.add_argument("--model", default="")
    parser.add_argument("--api-key-env", default="", metavar="VAR")
    parser.add_argument("--scripted", action="store_true")
    parser.add_argument("--size", type=int, default=8, help="rollouts in the group")
    args = parser.parse_args(argv)
    api_key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""

    with model_endpoint(args) as (base_url, model):
        request = RolloutRequest(
            endpoint="vllm",
            base_url=base_url,
            api_key=api_key,
            model=model,
            instruction=DEMO_INSTRUCTION,
            verify=DEMO_VERIFY,
            task_id="grpo_add",
        )
        try:
            results = asyncio.run(run_group(args, request))
        except ConnectionError as error:
            print(f"grpo_group: {error}", file=sys.stderr)
            return 2

    for index, result in enumerate(results):
        print(describe(index, result))
    print(training_summary(results[0]).text())
    batch = trl_batch(results)
    rewards = rollout_reward(batch["completion_ids"], batch["reward"], batch["usable"])
    print(f"TRL batch: {len(batch['prompt_ids'])} rows, keys {sorted(batch)}")
    print(f"rewards seen by TRL: {rewards}")
    return 0 if all(result.status == "completed" for result in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
