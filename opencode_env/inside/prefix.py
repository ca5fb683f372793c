"""How many leading items two lists share: the proxy's fold finds a turn's parent with it, and the wire and training
find where a prompt forks from earlier tokens. It is shipped beside the proxy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix_length(a: Sequence[Any], b: Sequence[Any]) -> int:
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
