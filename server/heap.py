"""The server's garbage collector, set for a heap of long-lived modules and short-lived rollout results.

The server's import-time heap (FastAPI, FastMCP, openenv-core, pydantic's schemas: ~200 MB) never becomes garbage,
yet every full collection walked it again: up to 0.6 s per collection at 256 rollouts in flight, on the event loop
every caller shares. Once the app is built it is moved out of the collector's sight (`gc.freeze`). Each rollout's
result is tens of thousands of short-lived containers freed by reference counting; with CPython's default of a
young collection every 700 allocations, collections took 40% of the server's CPU under load (6.8 of 15.8 s for
256 calls on /ws). With these thresholds, 1,000 calls on /ws ran no full collection and spent 8.4 s in the collector
instead of 19.2 s with a young collection every 10,000 (bench.server_load; figures in the performance issue).
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_ALLOCATIONS = 50_000
MIDDLE_COLLECTION_EVERY = 20
FULL_COLLECTION_EVERY = 100


def settle() -> None:
    """Collect once, keep everything alive now out of later collections, and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, MIDDLE_COLLECTION_EVERY, FULL_COLLECTION_EVERY)
