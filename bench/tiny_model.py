"""A tiny random-weights Qwen2 model and a locally trained BPE tokenizer, for serving with vLLM on CPU with no
download: run by the vLLM environment's Python (it needs torch, transformers and tokenizers, which this project does
not depend on), never by the project's.

    /path/to/vllm-venv/bin/python bench/tiny_model.py OUT_DIR

The tokenizer is trained on the Python standard library's sources of the running interpreter, with Qwen2.5's
special tokens (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`) and its `<tool_call>` tags, so vLLM's `hermes` tool
parser accepts it; the chat template is a ChatML one that renders tools and tool calls the way Qwen2.5's does. The
weights are random (seed 0): the model answers nonsense, which is all a capability probe needs. Idempotent: a
directory that already holds a model is left as it is.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 2048
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}{% set arguments = call.function.arguments %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ arguments if arguments is string else arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def corpus() -> list[str]:
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    return [path.read_text(errors="replace") for path in sources]


def make(out: Path) -> None:
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        print(f"{out}: already made")
        return
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AddedToken, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="float32",
    )
    Qwen2ForCausalLM(config).save_pretrained(out)
    print(f"{out}: vocab {len(tokenizer)}, {sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())} params")


if __name__ == "__main__":
    make(Path(sys.argv[1]))
