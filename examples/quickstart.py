"""Quick start: one rollout on a running opencode-env server, in the notebook form the README shows.

    opencode-env serve &                                                     # a server on localhost:8000
    python examples/quickstart.py --base-url http://GPU-HOST:8000/v1 --model Qwen/Qwen3-8B   # your vLLM
    python examples/quickstart.py --scripted                                 # the built-in scripted model

The API key, if your endpoint needs one, is read from the env var named by --api-key-env.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from opencode_env import OpenCodeEnv
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.scripted.script import demo_script
from opencode_env.training.sequences import training_summary


@contextlib.contextmanager
def model_endpoint(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(base URL, model) of the policy: the one given, or the scripted model started here on loopback."""
    if not args.scripted:
        yield args.base_url, args.model
        return
    try:
        from opencode_env.scripted.model import ScriptedModelServer  # the server extra's web stack
    except ModuleNotFoundError as missing:
        raise SystemExit(
            f"quickstart: --scripted serves the scripted model from this process, which needs the server extra "
            f"({missing.name} is not installed): pip install 'opencode-env[server]'"
        ) from missing

    with ScriptedModelServer(demo_script()) as scripted:
        yield scripted.base_url, "scripted-policy"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="http://localhost:8000", help="the opencode-env server")
    parser.add_argument("--base-url", default="", help="OpenAI-compatible URL of the policy model (vLLM)")
    parser.add_argument("--model", default="")
    parser.add_argument("--api-key-env", default="", metavar="VAR")
    parser.add_argument("--scripted", action="store_true", help="use the built-in scripted model (no GPU)")
    args = parser.parse_args(argv)
    api_key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""

    try:
        with model_endpoint(args) as (base_url, model), OpenCodeEnv(base_url=args.server) as env:
            result = env.run_rollout(
                endpoint="vllm",
                base_url=base_url,
                api_key=api_key,
                model=model,
                instruction=DEMO_INSTRUCTION,
                verify=DEMO_VERIFY,
                task_id="quickstart_add",
            )
    except ConnectionError as error:
        print(f"quickstart: {error}", file=sys.stderr)
        return 2
    print(result.status, result.reward, len(result.proxy_turns))

    turn = result.proxy_turns[0] if result.proxy_turns else None
    if turn is not None:
        print(f"first turn: {len(turn.prompt_token_ids)} prompt ids, {len(turn.completion_token_ids)} completion ids")
        print("first tokens:", list(zip(turn.completion_tokens[:5], turn.per_token_logps[:5], strict=True)))
    print(training_summary(result).text())
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
