"""``ktrain.run.host_gc``: the collector's passes counted and timed, and the objects of a run set aside."""

from __future__ import annotations

import gc

from ktrain.run import host_gc


def test_a_full_collection_is_counted_as_a_pass_over_the_oldest_generation() -> None:
    passes = host_gc.Collections()
    passes.start()
    gc.collect()
    gc.collect(0)
    passes.stop()
    gc.collect()  # after stop: not counted
    count, oldest, seconds = passes.totals()
    assert (count, oldest) == (2, 1) and seconds > 0


def test_settled_objects_are_left_out_of_collections_until_released() -> None:
    kept = [[i] for i in range(10_000)]
    host_gc.settle()
    try:
        assert gc.get_freeze_count() >= len(kept)
    finally:
        host_gc.release()
    assert gc.get_freeze_count() == 0
