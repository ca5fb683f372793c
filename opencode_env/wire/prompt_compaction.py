"""How a turn's prompt ids are written on the wire: a reference to a recent turn's ids plus the new suffix."""

from __future__ import annotations

from collections import Counter

from opencode_env.wire.turn import PromptBase, RolloutTurn

COMPACTION_WINDOW = 4


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading items a and b share (slice comparisons run in C; a binary search finds a divergence)."""
    limit = min(len(a), len(b))
    if (a if limit == len(a) else a[:limit]) == (b if limit == len(b) else b[:limit]):
        return limit
    low, high = 0, limit - 1
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _shared_with(base: RolloutTurn, prompt: list[int]) -> int:
    head, tail = base.prompt_token_ids, base.completion_token_ids
    shared = common_prefix_length(head, prompt)
    if shared < len(head):
        return shared
    return shared + common_prefix_length(tail, prompt[shared:])


def compact_prompts(turns: list[RolloutTurn]) -> list[RolloutTurn]:
    """The turns with each prompt written as a reference to a recent turn's ids plus its new suffix."""
    numbers = Counter(turn.turn for turn in turns)
    recent: list[RolloutTurn] = []
    out = []
    for turn in turns:
        prompt = turn.prompt_token_ids
        best, shared = None, 0
        for candidate in reversed(recent):
            if len(candidate.prompt_token_ids) + len(candidate.completion_token_ids) <= shared:
                continue
            count = _shared_with(candidate, prompt)
            if count > shared:
                best, shared = candidate, count
        if best is None:
            out.append(turn)
        else:
            base = PromptBase(turn=best.turn, count=shared)
            out.append(
                turn.model_copy(
                    update={"prompt_token_ids": [], "prompt_base": base, "prompt_suffix_ids": prompt[shared:]}
                )
            )
        if numbers[turn.turn] == 1 and prompt:
            recent = [*recent[-(COMPACTION_WINDOW - 1) :], turn]
    return out


def expanded_prompt(turn: RolloutTurn, earlier: dict[int, RolloutTurn], index: int) -> list[int]:
    """`turn`'s whole prompt: the ids its `prompt_base` names in an earlier turn, then its suffix."""
    base = turn.prompt_base
    if base is None:
        return list(turn.prompt_suffix_ids)
    source = earlier.get(base.turn)
    if source is None:
        raise ValueError(f"proxy_turns[{index}].prompt_base.turn: {base.turn} is not an earlier turn")
    head, tail = source.prompt_token_ids, source.completion_token_ids
    if base.count > len(head) + len(tail):
        raise ValueError(
            f"proxy_turns[{index}].prompt_base.count: {base.count} is over the {len(head) + len(tail)} ids of "
            f"turn {base.turn}"
        )
    prefix = head[: base.count] if base.count <= len(head) else head + tail[: base.count - len(head)]
    return prefix + turn.prompt_suffix_ids
