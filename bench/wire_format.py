"""Bytes on the wire per sampled token with top-5 alternatives, and the time to encode and decode 100k of them:
version 3's JSON lists against the packed arrays of versions 4 and 5 (alternatives with ids) and 6 (alternatives
named by text only, as an OpenAI-compatible server such as vLLM sends them), some also gzip-compressed (as the
result route sends it), side by side in one run. Then the prompt compaction of version 2: bytes per rollout and per
completion token, old shape (every turn carries its whole prompt) vs the compact shape, and the time to parse a
1,000-turn result and expand every prompt.

    uv run --frozen python -m bench.wire_format [--tokens 100000] [--turns 10 100 1000] [--start 10000]

Each turn: `completion` tokens generated (top-5 logprobs each), then `growth - completion` tool-output tokens, so
the context grows from `start` by `growth` ids per turn. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from array import array

from opencode_env.wire import UNPACKED_CONTEXT, MessagesBase, RolloutResult, RolloutTurn

EOS = 151645


def synthetic(turns: int, *, start: int, growth: int, completion: int, top_k: int = 5) -> RolloutResult:
    prompt = [1000 + (k * 7919) % 150_000 for k in range(start)]
    records = []
    for number in range(turns):
        generated = [2000 + (number * 131 + k * 17) % 150_000 for k in range(completion - 1)] + [EOS]
        records.append(
            RolloutTurn(
                turn=number,
                finish_reason="tool_calls",
                completion_tokens=[f"tok{token}" for token in generated],
                completion_token_ids=generated,
                per_token_logps=[-0.123456789012] * completion,
                top_logprobs=[[(f"alt{j}", -1.5 - j, 3000 + j) for j in range(top_k)] for _ in generated],
                prompt_token_ids=list(prompt),
                usage={"prompt_tokens": len(prompt), "completion_tokens": completion},
                aligned=True,
                token_id_source="return_token_ids",
                request={"messages": [{"role": "tool", "content": "output " * (growth - completion)}]},
                messages_base=MessagesBase(turn=number - 1, count=number) if number else None,
                response={"content": "", "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}]},
            )
        )
        tool_output = [5000 + (number * 31 + k) % 150_000 for k in range(growth - completion)]
        prompt = prompt + generated + tool_output
    return RolloutResult(task_id="synthetic", proxy_turns=records)


def sampled(
    tokens: int,
    *,
    in_top: float = 1.0,
    by_text: bool = False,
    per_turn: int = 1000,
    top_k: int = 5,
    seed: int = 7,
    float32: bool = True,
) -> RolloutResult:
    """`tokens` sampled tokens over turns of `per_turn`, as vLLM gives them: float32 logprobs, texts one per id; ids
    log-uniform over the vocabulary (text is Zipfian: a few ids recur, most are rare). At a share `in_top` of the
    positions the sampled token is one of its own alternatives with the same logprob (first of them four times in
    five: greedy decoding puts it first every time); elsewhere all k alternatives are other tokens, more likely than
    it. `by_text`: the alternatives carry their text and no id, as an OpenAI-compatible server sends them.
    `float32` False: float64 logprobs, as the scripted model sends by default (no float32 holds them)."""
    width = "f" if float32 else "d"
    rng = random.Random(seed)
    texts = {token_id: f"t{token_id}" for token_id in range(152_000)}
    turns = []
    for number in range((tokens + per_turn - 1) // per_turn):
        count = min(per_turn, tokens - number * per_turn)
        ids = [int(151_000 ** rng.random()) for _ in range(count)]
        logprobs = array(width, [-rng.expovariate(2.0) for _ in range(count)]).tolist()
        top = []
        for token_id, logprob in zip(ids, logprobs, strict=True):
            ranked = rng.random() < in_top
            rank = (0 if rng.random() < 0.8 else rng.randrange(1, top_k)) if ranked else top_k
            above = [logprob + rng.expovariate(0.8) for _ in range(rank)]
            below = [logprob - rng.expovariate(0.8) for _ in range(top_k - 1 - rank)] if ranked else []
            others = array(width, sorted(above + below, reverse=True)).tolist()
            alternatives: list[tuple[str, float, int | None]] = [
                (texts[i], lp, None if by_text else i)
                for i, lp in zip(rng.sample(range(5000), len(others)), others, strict=True)
            ]
            if ranked:
                alternatives.insert(rank, (texts[token_id], logprob, None if by_text else token_id))
            top.append(alternatives)
        turns.append(
            RolloutTurn(
                turn=number,
                completion_token_ids=ids,
                completion_tokens=[texts[i] for i in ids],
                per_token_logps=logprobs,
                top_logprobs=top,
                token_id_source="return_token_ids",
                aligned=True,
            )
        )
    return RolloutResult(task_id="sampled", proxy_turns=turns)


def token_rows(tokens: int) -> None:
    print(f"{tokens} sampled tokens, top-5 alternatives each; times per 100k tokens")
    print(f"{'form':<52} {'B/token':>8} {'encode ms':>10} {'decode ms':>10} {'vs v3 JSON':>11}")
    base = None
    lists = {UNPACKED_CONTEXT: True}
    for name, in_top, by_text, context, compress in (
        ("v3 JSON lists, alternatives with ids", 0.9, False, lists, False),
        ("v4 packed (v5, sampled never in its top-5)", 0.0, False, None, False),
        ("v5 packed, ids, sampled in its top-5 at 90%", 0.9, False, None, False),
        ("v5 packed, ids, sampled in its top-5 always", 1.0, False, None, False),
        ("v3 JSON lists, alternatives by text (v5 sends these)", 0.9, True, lists, False),
        ("v6 packed, by text, sampled in its top-5 at 90%", 0.9, True, None, False),
        ("v6 packed, by text, sampled in its top-5 always", 1.0, True, None, False),
        ("v6 packed, by text, sampled never in its top-5", 0.0, True, None, False),
        ("v3 JSON lists, ids + gzip -1", 0.9, False, lists, True),
        ("v5 packed, ids + gzip -1, in top-5 at 90%", 0.9, False, None, True),
        ("v3 JSON lists, by text + gzip -1", 0.9, True, lists, True),
        ("v6 packed, by text + gzip -1, in top-5 at 90%", 0.9, True, None, True),
    ):
        result = sampled(tokens, in_top=in_top, by_text=by_text)
        per_100k = 100_000 / tokens
        started = time.perf_counter()
        wire = result.model_dump_json(context=context).encode()
        if compress:
            wire = gzip.compress(wire, compresslevel=1)
        encode_s = time.perf_counter() - started
        started = time.perf_counter()
        parsed = RolloutResult.model_validate_json(gzip.decompress(wire) if compress else wire)
        decode_s = time.perf_counter() - started
        assert parsed.proxy_turns == result.proxy_turns
        per_token = len(wire) / tokens
        base = base or per_token
        print(
            f"{name:<52} {per_token:>8.1f} {encode_s * 1000 * per_100k:>10.0f} {decode_s * 1000 * per_100k:>10.0f} "
            f"{per_token / base:>10.2f}x"
        )


def old_shape_bytes(result: RolloutResult) -> int:
    """The version 1 JSON size: every turn serialised on its own with its whole prompt."""
    rest = len(result.model_dump_json(exclude={"proxy_turns"}))
    return rest + sum(len(turn.model_dump_json()) + 1 for turn in result.proxy_turns)


UNPACKED = {UNPACKED_CONTEXT: True}


def measure(turns: int, start: int, growth: int, completion: int) -> tuple[int, int, int]:
    result = synthetic(turns, start=start, growth=growth, completion=completion)
    generated = turns * completion
    return old_shape_bytes(result), len(result.model_dump_json(context=UNPACKED)), generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000, help="sampled tokens for the token table")
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--start", type=int, default=10_000, help="prompt ids of the first turn")
    parser.add_argument("--growth", type=int, default=60, help="context growth per turn (completion + tool output)")
    parser.add_argument("--completion", type=int, default=40, help="tokens generated per turn")
    args = parser.parse_args()
    token_rows(args.tokens)
    print(f"\ncontext: {args.start} ids, +{args.growth} per turn ({args.completion} generated, top-5 logprobs each)")
    print(f"{'turns':>6} {'old MB':>9} {'new MB':>9} {'old/new':>8} {'old B/tok':>10} {'new B/tok':>10}")
    for turns in args.turns:
        _row(turns, *measure(turns, args.start, args.growth, args.completion))
    print("\nthe issue's example: 100 turns, context 10k -> 40k (+300 per turn, 100 generated)")
    _row(100, *measure(100, 10_000, 300, 100))

    turns = max(args.turns)
    built = synthetic(turns, start=args.start, growth=args.growth, completion=args.completion)
    started = time.perf_counter()
    wire = built.model_dump_json()
    dump_s = time.perf_counter() - started
    del built
    loads_s = _json_loads_s(wire)
    started = time.perf_counter()
    parsed = RolloutResult.model_validate_json(wire)
    parse_s = time.perf_counter() - started
    started = time.perf_counter()
    prompt_ids = sum(len(parsed.prompt_ids(index)) for index in range(len(parsed.proxy_turns)))
    messages = parsed.all_turn_messages()
    access_s = time.perf_counter() - started
    print(
        f"\n{turns} turns, {len(wire) / 1e6:.1f} MB: serialise (compacting) {dump_s:.2f} s, "
        f"parse + expand every prompt {parse_s:.2f} s "
        f"({prompt_ids / 1e6:.1f} M prompt ids), every turn's messages {access_s:.2f} s "
        f"({sum(map(len, messages))} messages); json.loads alone {loads_s:.2f} s"
    )


def _row(turns: int, old: int, new: int, generated: int) -> None:
    per_old, per_new = old / generated, new / generated
    print(f"{turns:>6} {old / 1e6:>9.2f} {new / 1e6:>9.2f} {old / new:>8.1f} {per_old:>10.0f} {per_new:>10.0f}")


def _json_loads_s(wire: str) -> float:
    started = time.perf_counter()
    json.loads(wire)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
