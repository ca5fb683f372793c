"""The served app's garbage collector collects the young generation less often, and freezes nothing."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from opencode_env.server import heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)


def test_settling_raises_the_thresholds_and_leaves_every_object_collectable(restored_collector: None) -> None:
    frozen = gc.get_freeze_count()
    heap.settle()
    assert gc.get_freeze_count() == frozen
    young, middle, full = gc.get_threshold()
    assert young == heap.YOUNG_COLLECTION_ALLOCATIONS > 700
    assert (middle, full) == (heap.MIDDLE_COLLECTION_EVERY, heap.FULL_COLLECTION_EVERY)
