"""A turn's per-token arrays packed for the wire (schema_version 4 to 6): base64 of little-endian arrays, each text
once per result. JSON costs ~200 bytes per sampled token with top-5 alternatives, packed 47-66, and nothing is lost
(ids, order, every logprob bit for bit). The layout, for a reader in any language, is in docs/results.md; a turn this
layout cannot hold whole travels as JSON lists, as in version 3."""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT16_MAX = 2**15 - 1
NO_ID = -1
NO_TEXT = -1
NOT_RANKED = -1
RANKABLE_TOP_K = 127
"""The most alternatives a rank (one signed byte) can index."""
FloatWidth = Literal["f32", "f64"]
IndexWidth = Literal["i16", "i32"]
_TYPECODE: dict[FloatWidth | IndexWidth, str] = {"f32": "f", "f64": "d", "i16": "h", "i32": "i"}


class PackedTokens(BaseModel):
    """A turn's per-token arrays, packed (see the module doc for the layout)."""

    count: int = Field(ge=0, description="n: the sampled tokens.")
    top_k: int = Field(ge=0, description="k: alternatives at every position (0: none recorded).")
    float: FloatWidth = Field(description="The width of every logprob array: f32 or f64, little-endian.")
    ids: str = Field(
        description="base64 of int32: the sampled ids of the positions ranked -1 or whose ranked alternative has no "
        "id (every position when sampled_rank is empty)."
    )
    logprobs: str = Field(
        description="base64 of float: the sampled logprobs of the positions ranked -1 (every position when "
        "sampled_rank is empty)."
    )
    top_ids: str = Field(
        "",
        description="base64 of int32[n*k], row-major; -1 for an alternative without an id; empty when no alternative "
        "has an id.",
    )
    top_logprobs: str = Field("", description="base64 of float[n*k], row-major.")
    top_texts: str = Field(
        "",
        description="base64 of int32[n*k], row-major: an id-less alternative's index in the result's text table (the "
        "alt_texts of its packed turns, in order); -1 for an alternative with an id; empty when every alternative "
        "has an id (schema_version 6).",
    )
    top_texts_width: IndexWidth = Field(
        "i32",
        description="The width of top_texts: i16 while the result's text table has at most 32768 texts, else i32.",
    )
    sampled_rank: str = Field(
        "",
        description="base64 of int8[n]: the index among its position's alternatives of one that is the sampled token "
        "(same logprob bit for bit; same id, or same text when it has no id), or -1 (schema_version 5).",
    )
    vocab_ids: str = Field(description="base64 of int32[m]: every token id whose text is in `vocab`.")
    vocab: list[str] = Field(description="The text of each id of vocab_ids, in the same order.")
    alt_texts: list[str] = Field(
        default_factory=list,
        description="The texts this turn adds to the result's text table of id-less alternatives (schema_version 6).",
    )


Alternative = tuple[str, float, int | None]


@dataclass
class ResultTexts:
    """The texts a result's packed turns carry, read or written turn by turn in order: each token id's text, and the
    table of the texts of alternatives without an id."""

    by_id: dict[int, str] = field(default_factory=dict)
    table: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def extend_table(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.index.setdefault(text, len(self.table))
            self.table.append(text)


def _b64(values: array) -> str:  # type: ignore[type-arg]
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unb64(text: str, typecode: str, expected: int, name: str) -> array:  # type: ignore[type-arg]
    values = array(typecode)
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as error:
        raise ValueError(f"packed.{name}: not base64 ({error})") from None
    if len(raw) != expected * values.itemsize:
        raise ValueError(f"packed.{name}: {len(raw)} bytes, expected {expected * values.itemsize}")
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


def _rank(token_id: int, text: str, logprob: float, row: Sequence[Alternative]) -> int:
    """The first alternative of the row that is the sampled token (see the module doc), or NOT_RANKED."""
    for rank, (alt_text, alt_logprob, alt_id) in enumerate(row):
        same_token = alt_id == token_id if alt_id is not None else alt_text == text
        if same_token and _same_float(alt_logprob, logprob):
            return rank
    return NOT_RANKED


def pack(
    ids: Sequence[int],
    logprobs: Sequence[float],
    texts: Sequence[str],
    top: Sequence[Sequence[Alternative]],
    known: ResultTexts | None = None,
) -> PackedTokens | None:
    """The packed form of one turn's arrays, or None when the layout cannot hold them exactly. `known`: the texts
    earlier packed turns of the result carry (left out of this turn's); the turn's new ones are added to it when it
    packs."""
    count = len(ids)
    if count == 0 or len(logprobs) != count or len(texts) != count or (top and len(top) != count):
        return None
    top_k = len(top[0]) if top else 0
    known = ResultTexts() if known is None else known
    new: dict[int, str] = {}
    new_texts: dict[str, int] = {}

    def one_text(token_id: int, text: str) -> bool:
        seen = known.by_id.get(token_id)
        return (new.setdefault(token_id, text) if seen is None else seen) == text

    def text_index(text: str) -> int:
        index = known.index.get(text)
        return new_texts.setdefault(text, len(known.table) + len(new_texts)) if index is None else index

    if not all(one_text(token_id, text) for token_id, text in zip(ids, texts, strict=True)):
        return None
    top_ids: list[int] = []
    top_texts: list[int] = []
    top_logprobs: list[float] = []
    for position in top:
        if len(position) != top_k:
            return None
        for text, logprob, token_id in position:
            if token_id is None:
                top_ids.append(NO_ID)
                top_texts.append(text_index(text))
            elif one_text(token_id, text):
                top_ids.append(token_id)
                top_texts.append(NO_TEXT)
            else:
                return None
            top_logprobs.append(logprob)
    if any(not INT32_MIN <= token_id <= INT32_MAX or token_id == NO_ID for token_id in new):
        return None
    width = _float_width([*logprobs, *top_logprobs])
    code = _TYPECODE[width]
    known.by_id.update(new)
    known.extend_table(list(new_texts))
    index_width: IndexWidth = "i16" if len(known.table) <= INT16_MAX + 1 else "i32"
    ranks = [NOT_RANKED] * count
    if 0 < top_k <= RANKABLE_TOP_K:
        ranks = [_rank(*token, row) for token, row in zip(zip(ids, texts, logprobs, strict=True), top, strict=True)]
    own_ids = [
        token_id
        for position, (token_id, rank) in enumerate(zip(ids, ranks, strict=True))
        if rank == NOT_RANKED or top_ids[position * top_k + rank] == NO_ID
    ]
    own_logprobs = [logprob for logprob, rank in zip(logprobs, ranks, strict=True) if rank == NOT_RANKED]
    ranked = any(rank != NOT_RANKED for rank in ranks)
    return PackedTokens(
        count=count,
        top_k=top_k,
        float=width,
        ids=_b64(array("i", own_ids if ranked else ids)),
        logprobs=_b64(array(code, own_logprobs if ranked else logprobs)),
        top_ids=_b64(array("i", top_ids)) if any(token_id != NO_ID for token_id in top_ids) else "",
        top_logprobs=_b64(array(code, top_logprobs)) if top_k else "",
        top_texts=_b64(array(_TYPECODE[index_width], top_texts)) if any(i != NO_TEXT for i in top_texts) else "",
        top_texts_width=index_width,
        sampled_rank=_b64(array("b", ranks)) if ranked else "",
        vocab_ids=_b64(array("i", new)),
        vocab=list(new.values()),
        alt_texts=list(new_texts),
    )


def unpack(
    packed: PackedTokens, known: ResultTexts | None = None
) -> tuple[list[int], list[float], list[str], list[list[Alternative]]]:
    """The turn's lists back: (ids, logprobs, texts, alternatives per position). `known`: the texts of earlier
    packed turns of the same result; this turn's own are added to it."""
    count, top_k, code = packed.count, packed.top_k, _TYPECODE[packed.float]
    known = ResultTexts() if known is None else known
    vocab_ids = _unb64(packed.vocab_ids, "i", len(packed.vocab), "vocab_ids")
    known.by_id.update(zip(vocab_ids.tolist(), packed.vocab, strict=True))
    known.extend_table(packed.alt_texts)
    slots = count * top_k
    if not top_k and (packed.top_ids or packed.top_texts or packed.top_logprobs):
        raise ValueError("packed.top_k: 0, yet the turn carries alternatives (top_ids, top_texts or top_logprobs)")
    # Decoded first: its length bounds n*k by the bytes actually sent before any list of that size is made.
    alt_logprobs: list[float] = _unb64(packed.top_logprobs, code, slots, "top_logprobs").tolist()
    alt_ids = _unb64(packed.top_ids, "i", slots, "top_ids").tolist() if packed.top_ids else [NO_ID] * slots
    alt_texts = (
        _unb64(packed.top_texts, _TYPECODE[packed.top_texts_width], slots, "top_texts").tolist()
        if packed.top_texts
        else [NO_TEXT] * slots
    )
    try:
        alternatives = [
            _alternative(known, token_id, index, logprob, slot)
            for slot, (token_id, index, logprob) in enumerate(zip(alt_ids, alt_texts, alt_logprobs, strict=True))
        ]
        ids, logprobs = _sampled(packed, alt_ids, alt_logprobs)
        texts = [known.by_id[token_id] for token_id in ids]
    except KeyError as missing:
        raise ValueError(f"packed.vocab: no text for token id {missing}") from None
    top = [alternatives[start : start + top_k] for start in range(0, slots, top_k)] if top_k else []
    return ids, logprobs, texts, top


def _alternative(known: ResultTexts, token_id: int, index: int, logprob: float, slot: int) -> Alternative:
    if token_id != NO_ID:
        if index != NO_TEXT:
            raise ValueError(f"packed.top_texts: alternative {slot} has both an id and a text index")
        return known.by_id[token_id], logprob, token_id
    if index == NO_TEXT:
        raise ValueError(f"packed.top_texts: alternative {slot} has neither an id (top_ids) nor a text index")
    if not 0 <= index < len(known.table):
        raise ValueError(
            f"packed.top_texts: alternative {slot}'s index {index} is outside the result's {len(known.table)} "
            "alt_texts so far"
        )
    return known.table[index], logprob, None


def _sampled(packed: PackedTokens, alt_ids: list[int], alt_logprobs: list[float]) -> tuple[list[int], list[float]]:
    """The sampled ids and logprobs: a ranked position's logprob (and id, when its alternative has one) from its
    alternative, the others in order from `ids` and `logprobs`."""
    count, top_k, code = packed.count, packed.top_k, _TYPECODE[packed.float]
    if not packed.sampled_rank:
        return _unb64(packed.ids, "i", count, "ids").tolist(), _unb64(packed.logprobs, code, count, "logprobs").tolist()
    ranks = _unb64(packed.sampled_rank, "b", count, "sampled_rank").tolist()
    if not top_k or any(not NOT_RANKED <= rank < top_k for rank in ranks):
        raise ValueError(f"packed.sampled_rank: a rank outside -1..{top_k - 1}")
    slots = [position * top_k + rank for position, rank in enumerate(ranks)]
    own_id_count = sum(rank == NOT_RANKED or alt_ids[slot] == NO_ID for rank, slot in zip(ranks, slots, strict=True))
    own_ids = iter(_unb64(packed.ids, "i", own_id_count, "ids").tolist())
    own_logprobs = iter(_unb64(packed.logprobs, code, ranks.count(NOT_RANKED), "logprobs").tolist())
    ids: list[int] = []
    logprobs: list[float] = []
    for rank, slot in zip(ranks, slots, strict=True):
        ranked = rank != NOT_RANKED
        ids.append(alt_ids[slot] if ranked and alt_ids[slot] != NO_ID else next(own_ids))
        logprobs.append(alt_logprobs[slot] if ranked else next(own_logprobs))
    return ids, logprobs
