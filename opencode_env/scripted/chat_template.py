"""A toy tokenizer and ChatML-style template with the property RL capture depends on.

Text is cut into segments (special tokens, message bodies, tool-call parts) and each segment is tokenized on its
own, so rendering a conversation and rendering its assistant replies one by one give the same ids: the prompt of
turn N+1 extends the prompt + completion of turn N, as with a real engine's chat template.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_IDS = {IM_START: 151644, IM_END: 151645}
EOS = IM_END

_PIECE = re.compile(r"\w+|\s+|[^\w\s]", re.UNICODE)

TemplateVariant = Literal["chatml", "chatml_colon", "think_last"]
"""chatml_colon renders a role header as `role:` rather than `role`: another template, so other prompt ids (the
scripted model switches to it to show a template change between two calls of one rollout). think_last looks at the
whole history, as Qwen3's template does with thinking off: the generation prompt ends with an empty think block, and
an assistant message carries one only while it is the last message, so a reply renders differently once messages
follow it."""
EMPTY_THINK = "<think>\n\n</think>\n\n"

SegmentKind = Literal["special", "text", "content", "reasoning", "tool_head", "tool_args", "tool_tail"]


@dataclass(frozen=True)
class Segment:
    text: str
    kind: SegmentKind = "text"
    tool_index: int = -1


def token_id(piece: str) -> int:
    special = SPECIAL_IDS.get(piece)
    if special is not None:
        return special
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return 1000 + int.from_bytes(digest, "big") % 150_000


def split_pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def tokenize_segments(segments: Iterable[Segment]) -> list[tuple[str, int, Segment]]:
    tokens: list[tuple[str, int, Segment]] = []
    for segment in segments:
        pieces = [segment.text] if segment.kind == "special" else split_pieces(segment.text)
        tokens.extend((piece, token_id(piece), segment) for piece in pieces)
    return tokens


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content, ensure_ascii=False)


def assistant_body(content: str, tool_calls: Sequence[tuple[str, str]], reasoning: str = "") -> list[Segment]:
    """The segments of an assistant reply: optional reasoning, text, then each (name, arguments) tool call."""
    segments: list[Segment] = []
    if reasoning:
        segments.append(Segment(f"<think>\n{reasoning}\n</think>\n\n", "reasoning"))
    if content:
        segments.append(Segment(content, "content"))
    for index, (name, arguments) in enumerate(tool_calls):
        segments.append(Segment(f'<tool_call>\n{{"name": "{name}", "arguments": ', "tool_head", index))
        segments.append(Segment(arguments, "tool_args", index))
        segments.append(Segment("}\n</tool_call>", "tool_tail", index))
    return segments


def _message_segments(
    message: dict[str, Any], variant: TemplateVariant = "chatml", *, last: bool = False
) -> list[Segment]:
    role = str(message.get("role", "user"))
    if role == "assistant":
        calls = [
            (str(call["function"]["name"]), str(call["function"].get("arguments", "")))
            for call in message.get("tool_calls") or []
        ]
        body = assistant_body(_content_text(message.get("content")), calls)
        if variant == "think_last" and last:
            body = [Segment(EMPTY_THINK), *body]
    else:
        body = [Segment(_content_text(message.get("content")))]
    return [
        Segment(IM_START, "special"),
        Segment(f"{role}:\n" if variant == "chatml_colon" else f"{role}\n"),
        *body,
        Segment(IM_END, "special"),
        Segment("\n"),
    ]


def render_prompt(
    messages: Sequence[dict[str, Any]], *, generation_prompt: bool = True, variant: TemplateVariant = "chatml"
) -> list[Segment]:
    """Like a thinking model's template: an earlier reply is rendered without its reasoning, so a reply the model
    sampled with reasoning is not a prefix of the next prompt."""
    segments: list[Segment] = []
    for index, message in enumerate(messages):
        segments.extend(_message_segments(message, variant, last=index == len(messages) - 1))
    if generation_prompt:
        segments.extend(
            [Segment(IM_START, "special"), Segment("assistant:\n" if variant == "chatml_colon" else "assistant\n")]
        )
        if variant == "think_last":
            segments.append(Segment(EMPTY_THINK))
    return segments


def prompt_token_ids(
    messages: Sequence[dict[str, Any]], *, generation_prompt: bool = True, variant: TemplateVariant = "chatml"
) -> list[int]:
    rendered = render_prompt(messages, generation_prompt=generation_prompt, variant=variant)
    return [token for _, token, _ in tokenize_segments(rendered)]
