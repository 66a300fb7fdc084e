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


def test_imports_run_without_the_collector_and_what_they_made_is_left_out_after() -> None:
    passes = host_gc.Collections()
    passes.start()
    try:
        with host_gc.imports_uncollected():
            assert not gc.isenabled()
            made = [[i] for i in range(10_000)]  # ten thousand allocations: passes, were the collector on
        assert gc.isenabled() and gc.get_freeze_count() >= len(made)
    finally:
        passes.stop()
        host_gc.release()
    assert passes.totals()[0] == 0


def test_a_collector_switched_off_stays_off() -> None:
    gc.disable()
    try:
        with host_gc.imports_uncollected():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        host_gc.release()
