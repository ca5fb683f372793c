"""A turn's per-token arrays packed for the wire (schema_version 4, and 5 with `sampled_rank`): base64 of
little-endian arrays.

Four per-token lists of a turn (`completion_token_ids`, `per_token_logps`, `completion_tokens` and `top_logprobs`)
cost ~200 bytes per sampled token as JSON with top-5 alternatives; packed they cost 48 bytes of arrays (64 in
base64) plus each distinct token's text once. The sampled token is most often one of its own alternatives (always
the first under greedy decoding), with the very same logprob: version 5 then writes one byte, its rank among the
alternatives, instead of its id and logprob again (41 bytes of arrays, ~55 in base64, at a position where it is).
Nothing is lost: ids and their order, every logprob bit for bit (float32 when every value of the turn is a
float32, which is what vLLM computes; float64 otherwise), every alternative in its order, every token's text.

The layout, for a reader in any language (n sampled tokens, k alternatives at every position):
- `ids`: int32[n], the sampled token ids.
- `logprobs`: float32[n] or float64[n] (`float` says which), the sampled tokens' logprobs.
- `top_ids`: int32[n*k] and `top_logprobs`: float[n*k], row-major (position by position, alternatives in order);
  an alternative without an id is -1. Absent (k = 0) when the turn has no alternatives.
- `sampled_rank`: int8[n] (version 5; absent or "" in version 4): at each position, the index among that
  position's alternatives of the one that is the sampled token (same id, same logprob bit for bit), or -1. When
  present, `ids` and `logprobs` hold only the positions whose rank is -1, in order; the others are the ranked
  alternative's id and logprob.
- `vocab_ids` int32[m] and `vocab` (m strings): the text of each token id first used by this turn; a token's text
  is `vocab[index of its id in vocab_ids]` of this turn or of an earlier packed turn of the same result (each id's
  text is written once per result: read the turns in order, keeping one id -> text map).
Every array is little-endian, then standard base64 (RFC 4648, with padding). NaN and the infinities are the IEEE
values themselves. A turn packs only when this layout holds all of it (every position has an id and k
alternatives, one text per id); otherwise its lists travel as JSON, as before.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
NO_ID = -1
NOT_RANKED = -1
RANKABLE_TOP_K = 127
"""The most alternatives a rank (one signed byte) can index."""
FloatWidth = Literal["f32", "f64"]
_TYPECODE: dict[FloatWidth, str] = {"f32": "f", "f64": "d"}


class PackedTokens(BaseModel):
    """A turn's per-token arrays, packed (see the module doc for the layout)."""

    count: int = Field(ge=0, description="n: the sampled tokens.")
    top_k: int = Field(ge=0, description="k: alternatives at every position (0: none recorded).")
    float: FloatWidth = Field(description="The width of every logprob array: f32 or f64, little-endian.")
    ids: str = Field(description="base64 of int32[n]: the sampled token ids.")
    logprobs: str = Field(description="base64 of float[n]: the sampled tokens' logprobs.")
    top_ids: str = Field("", description="base64 of int32[n*k], row-major; -1 for an alternative without an id.")
    top_logprobs: str = Field("", description="base64 of float[n*k], row-major.")
    sampled_rank: str = Field(
        "",
        description="base64 of int8[n]: the sampled token's index among its position's alternatives, or -1; when set, "
        "ids and logprobs hold only the positions ranked -1 (schema_version 5).",
    )
    vocab_ids: str = Field(description="base64 of int32[m]: every token id whose text is in `vocab`.")
    vocab: list[str] = Field(description="The text of each id of vocab_ids, in the same order.")


Alternative = tuple[str, float, int | None]


def _b64(values: array) -> str:  # type: ignore[type-arg]
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unb64(text: str, typecode: str, expected: int, field: str) -> array:  # type: ignore[type-arg]
    values = array(typecode)
    raw = base64.b64decode(text, validate=True)
    if len(raw) != expected * values.itemsize:
        raise ValueError(f"packed.{field}: {len(raw)} bytes, expected {expected * values.itemsize}")
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _float_width(values: Sequence[float]) -> FloatWidth:
    """f32 when every value survives float32 exactly (bit for bit, NaN included)."""
    wide = array("d", values)
    return "f32" if array("d", array("f", wide)).tobytes() == wide.tobytes() else "f64"


def _same_float(a: float, b: float) -> bool:
    """Equal bit for bit within one width: -0.0 is not 0.0, and NaN (whose payload could differ) never matches."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _ranks(
    ids: Sequence[int], logprobs: Sequence[float], top_ids: list[int], top_logprobs: list[float], k: int
) -> list[int]:
    """Each position's sampled token as an index among its alternatives, or NOT_RANKED."""
    ranks = []
    for position, token_id in enumerate(ids):
        start = position * k
        row = top_ids[start : start + k]
        rank = row.index(token_id) if token_id in row else NOT_RANKED
        if rank != NOT_RANKED and not _same_float(top_logprobs[start + rank], logprobs[position]):
            rank = NOT_RANKED
        ranks.append(rank)
    return ranks


def pack(
    ids: Sequence[int],
    logprobs: Sequence[float],
    texts: Sequence[str],
    top: Sequence[Sequence[Alternative]],
    known: dict[int, str] | None = None,
) -> PackedTokens | None:
    """The packed form of one turn's arrays, or None when the layout cannot hold them exactly. `known`: the texts
    earlier packed turns of the result carry (left out of this turn's vocab); the turn's new ones are added to it
    when it packs."""
    count = len(ids)
    if count == 0 or len(logprobs) != count or len(texts) != count or (top and len(top) != count):
        return None
    top_k = len(top[0]) if top else 0
    known = {} if known is None else known
    new: dict[int, str] = {}

    def one_text(token_id: int | None, text: str) -> bool:
        if token_id is None:
            return False
        seen = known.get(token_id)
        return (new.setdefault(token_id, text) if seen is None else seen) == text

    if not all(one_text(token_id, text) for token_id, text in zip(ids, texts, strict=True)):
        return None
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    for position in top:
        if len(position) != top_k or not all(one_text(token_id, text) for text, _, token_id in position):
            return None
        for _, logprob, token_id in position:
            top_ids.append(token_id)  # type: ignore[arg-type]
            top_logprobs.append(logprob)
    if any(not INT32_MIN <= token_id <= INT32_MAX or token_id == NO_ID for token_id in new):
        return None
    width = _float_width([*logprobs, *top_logprobs])
    code = _TYPECODE[width]
    known.update(new)
    ranks = _ranks(ids, logprobs, top_ids, top_logprobs, top_k) if 0 < top_k <= RANKABLE_TOP_K else []
    if any(rank != NOT_RANKED for rank in ranks):
        unranked = [position for position, rank in enumerate(ranks) if rank == NOT_RANKED]
        ids = [ids[position] for position in unranked]
        logprobs = [logprobs[position] for position in unranked]
    else:
        ranks = []
    return PackedTokens(
        count=count,
        top_k=top_k,
        float=width,
        ids=_b64(array("i", ids)),
        logprobs=_b64(array(code, logprobs)),
        top_ids=_b64(array("i", top_ids)) if top_k else "",
        top_logprobs=_b64(array(code, top_logprobs)) if top_k else "",
        sampled_rank=_b64(array("b", ranks)) if ranks else "",
        vocab_ids=_b64(array("i", new)),
        vocab=list(new.values()),
    )


def unpack(
    packed: PackedTokens, known: dict[int, str] | None = None
) -> tuple[list[int], list[float], list[str], list[list[Alternative]]]:
    """The turn's lists back: (ids, logprobs, texts, alternatives per position). `known`: the texts of earlier
    packed turns of the same result; this turn's own are added to it."""
    count, top_k, code = packed.count, packed.top_k, _TYPECODE[packed.float]
    vocab_ids = _unb64(packed.vocab_ids, "i", len(packed.vocab), "vocab_ids")
    text_of = {} if known is None else known
    text_of.update(zip(vocab_ids.tolist(), packed.vocab, strict=True))
    alt_ids: list[int] = []
    alt_logprobs: list[float] = []
    if top_k:
        alt_ids = _unb64(packed.top_ids, "i", count * top_k, "top_ids").tolist()
        alt_logprobs = _unb64(packed.top_logprobs, code, count * top_k, "top_logprobs").tolist()
    if packed.sampled_rank:
        ids, logprobs = _ranked(packed, alt_ids, alt_logprobs)
    else:
        ids = _unb64(packed.ids, "i", count, "ids").tolist()
        logprobs = _unb64(packed.logprobs, code, count, "logprobs").tolist()
    try:
        texts = [text_of[token_id] for token_id in ids]
        alternatives: list[Alternative] = [(text_of[i], lp, i) for i, lp in zip(alt_ids, alt_logprobs, strict=True)]
    except KeyError as missing:
        raise ValueError(f"packed.vocab: no text for token id {missing}") from None
    top = [alternatives[start : start + top_k] for start in range(0, count * top_k, top_k)] if top_k else []
    return ids, logprobs, texts, top


def _ranked(packed: PackedTokens, alt_ids: list[int], alt_logprobs: list[float]) -> tuple[list[int], list[float]]:
    """The sampled ids and logprobs of a turn packed with `sampled_rank`: a ranked position's from its alternative,
    the others in order from `ids` and `logprobs`."""
    count, top_k = packed.count, packed.top_k
    ranks = _unb64(packed.sampled_rank, "b", count, "sampled_rank").tolist()
    if not top_k or any(not NOT_RANKED <= rank < top_k for rank in ranks):
        raise ValueError(f"packed.sampled_rank: a rank outside -1..{top_k - 1}")
    unranked = ranks.count(NOT_RANKED)
    own_ids = iter(_unb64(packed.ids, "i", unranked, "ids").tolist())
    own_logprobs = iter(_unb64(packed.logprobs, _TYPECODE[packed.float], unranked, "logprobs").tolist())
    ids: list[int] = []
    logprobs: list[float] = []
    for position, rank in enumerate(ranks):
        if rank == NOT_RANKED:
            ids.append(next(own_ids))
            logprobs.append(next(own_logprobs))
        else:
            ids.append(alt_ids[position * top_k + rank])
            logprobs.append(alt_logprobs[position * top_k + rank])
    return ids, logprobs
