"""How the benchmarks print a set of timings."""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> str:
    """p10, p50 and p90 of timings in seconds, as milliseconds."""
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"p10 {pick(0.1) * 1000:7.1f}  p50 {statistics.median(ordered) * 1000:7.1f}  p90 {pick(0.9) * 1000:7.1f} ms"
