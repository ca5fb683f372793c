"""How the benchmarks print a set of timings."""

from __future__ import annotations

import random
import statistics


def spread(values: list[float]) -> str:
    """p10, p50 and p90 of timings in seconds, as milliseconds."""
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"p10 {pick(0.1) * 1000:7.1f}  p50 {statistics.median(ordered) * 1000:7.1f}  p90 {pick(0.9) * 1000:7.1f} ms"


def mean_ci(values: list[float], *, resamples: int = 4000, seed: int = 0) -> str:
    """The mean and its 95% bootstrap confidence interval (percentiles of resampled means), as text."""
    if not values:
        return "n/a"
    draw = random.Random(seed)
    means = sorted(statistics.fmean(draw.choices(values, k=len(values))) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return f"{statistics.fmean(values):8.3f} [{low:8.3f}, {high:8.3f}]  n={len(values)}"
