"""The float type of the wire: NaN and the infinities travel as named strings, since JSON has no such numbers."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import PlainSerializer

NonFiniteName = Literal["Infinity", "-Infinity", "NaN"]


def _float_for_json(value: float) -> float | NonFiniteName:
    """JSON has no NaN or infinities, and pydantic writes them as null, which does not parse back as a float."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


WireFloat = Annotated[float, PlainSerializer(_float_for_json, return_type=float | NonFiniteName, when_used="json")]
"""A float that every JSON form of a result carries: `model_dump_json` and `model_dump(mode="json")` write NaN,
Infinity and -Infinity as those strings (the serialization schema, which MCP clients check, allows them), and
validation reads the strings back as the floats. Standard JSON parsers accept it: JavaScript's JSON.parse gives the
string, and `Number(x)` the number."""
