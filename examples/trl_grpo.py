"""One real TRL GRPOTrainer step on CPU, fed by OpenCode rollouts (scripted model, local sandboxes).

    uv sync --group trl && uv run python examples/trl_grpo.py

The `trl` group downloads about 2.4 GB of wheels on Linux x86-64 (uv.lock's sizes): PyPI's torch (0.54 GB) brings
1.8 GB of NVIDIA CUDA libraries and Triton that this CPU step never uses. PyPI has no CPU-only torch; to skip them,
install torch from PyTorch's CPU index into an environment of your own (`pip install torch --index-url
https://download.pytorch.org/whl/cpu`, then `pip install trl datasets` and this package with its server extra).

The policy is a tiny causal LM built here with random weights and a vocabulary that covers the scripted model's
token ids, so no model is downloaded. TRL (1.16.0) calls `rollout_func` on its own path whether or not vLLM is used:
no trainer subclass is needed. Each row's prompt and completion ids are the engine's (the scripted model's), with
the env mask marking tool output between turns.

The rollouts run in token-in mode against a scripted model that plays stock vLLM (its chat route takes forwarded
prompt ids), so each row is the whole session: the example prints how many of the agent's tokens the rows carry
(TRL trains on one row per rollout; a row that forked would carry only the session's last part).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from opencode_env.evals.trl_rollout import make_rollout_func
from opencode_env.rollout.in_process import InProcess
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.chat_template import EOS, SPECIAL_IDS
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.training.coverage import percent
from opencode_env.training.formats import rollout_reward
from opencode_env.wire import RolloutRequest

VOCAB_SIZE = max(SPECIAL_IDS.values()) + 1
RolloutFunc = Callable[[list[Any], Any], dict[str, list[Any]]]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"t{index}": index for index in range(VOCAB_SIZE)}
    for text, index in SPECIAL_IDS.items():
        vocab[text] = index
        del vocab[f"t{index}"]
    tokenizer = Tokenizer(WordLevel(vocab=vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token="t0", unk_token="t0")


def tiny_policy() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16_384,
        tie_word_embeddings=True,
        eos_token_id=SPECIAL_IDS[EOS],
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


class Requests:
    """prompt -> RolloutRequest. Every other rollout is checked by a verify command that fails, so a group's
    rewards differ (1.0 and 0.0) and the step has a gradient although the scripted policy always does the same."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.made = 0

    def __call__(self, prompt: str) -> RolloutRequest:
        self.made += 1
        verify = None if self.made % 2 else ["test -f /home/user/workdir/missing.py"]
        fields = {"verify": verify} if verify else {}
        return demo_request(self.base_url, instruction=prompt, task_id="trl_add", token_in="auto", **fields)


def with_coverage(rollout_func: RolloutFunc) -> RolloutFunc:
    """`rollout_func`, printing how many of the rollouts' agent tokens its TRL rows carry."""

    def counted(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        rows = rollout_func(prompts, trainer)
        covered, agent = sum(rows["covered_tokens"]), sum(rows["agent_tokens"])
        shown = percent(covered, agent) if agent else "-"
        print(f"TRL rows: {covered:,} of {agent:,} agent tokens ({shown}) in {len(rows['covered_tokens'])} rows")
        return rows

    return counted


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=2, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.output_dir or Path(tempfile.mkdtemp(prefix="trl-grpo-"))
    sandboxes = work / "sandboxes"
    sandboxes.mkdir(parents=True, exist_ok=True)

    policy = tiny_policy()
    before = policy.model.embed_tokens.weight.detach().clone()
    with ScriptedModelServer(demo_script(), forwarded_ids="on") as model:
        rollout_func = with_coverage(
            make_rollout_func(InProcess(LocalBackend(cached_tools, base_dir=sandboxes)), Requests(model.base_url))
        )
        config = GRPOConfig(
            output_dir=str(work / "out"),
            use_cpu=True,
            bf16=False,
            num_generations=args.generations,
            per_device_train_batch_size=args.generations,
            gradient_accumulation_steps=1,
            max_steps=1,
            max_completion_length=1024,
            learning_rate=1e-2,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
        )
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=[rollout_reward],
            args=config,
            train_dataset=Dataset.from_dict({"prompt": [demo_request("http://x").instruction] * 4}),
            processing_class=tiny_tokenizer(),
            rollout_func=rollout_func,
        )
        trainer.train()
    moved = (policy.model.embed_tokens.weight.detach() - before).abs().sum().item()
    history = trainer.state.log_history
    print(f"one GRPO step on {args.generations} rollouts: weights moved by {moved:.4f}")
    print(
        "logged:", {key: value for key, value in history[0].items() if "reward" in key or key in ("loss", "grad_norm")}
    )
    return 0 if moved > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
