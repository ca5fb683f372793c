"""The served app's garbage collector keeps the import-time heap out of its walks and collects less often."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from server import heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_settling_freezes_what_is_alive_and_raises_the_thresholds(restored_collector: None) -> None:
    assert gc.get_freeze_count() == 0
    tracked = len(gc.get_objects())
    heap.settle()
    assert gc.get_freeze_count() > tracked * 0.9
    assert len(gc.get_objects()) < tracked * 0.1
    young, middle, full = gc.get_threshold()
    assert young == heap.YOUNG_COLLECTION_ALLOCATIONS > 700
    assert (middle, full) == (heap.MIDDLE_COLLECTION_EVERY, heap.FULL_COLLECTION_EVERY)
