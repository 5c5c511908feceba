"""A server's capacity from its shards' health: each engine's slots counted once."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duplex.topology._capacity import merged_sessions


def shard(live: int, capacity: int, *slots: int) -> dict[str, Any]:
    engines = [{"engine": i, "status": "ok", "slots": n} for i, n in enumerate(slots)]
    return {"status": "ok", "sessions": {"live": live, "capacity": capacity}, "engines": engines}


def test_two_shards_of_one_engine_process_count_its_slots_once() -> None:
    shards = [shard(60, 146, 146), shard(70, 146, 146)]
    merged = merged_sessions(shards, shared_engines=True)
    assert (merged.live, merged.capacity, merged.engines) == (130, 146, 1)
    # the same reports from shards that each run their own engine: two engines
    merged = merged_sessions(shards, shared_engines=False)
    assert (merged.capacity, merged.engines) == (292, 2)


def test_shard_bounds_still_bound_a_shared_engine() -> None:
    # max_sessions 100 split over two shards of one 146-slot engine
    merged = merged_sessions([shard(0, 50, 146), shard(0, 50, 146)], shared_engines=True)
    assert merged.capacity == 100


def test_two_engine_processes_are_two_engines() -> None:
    shards = [shard(1, 292, 146, 146), shard(1, 292, 146, 146)]
    assert merged_sessions(shards, shared_engines=True).as_dict() == {"live": 2, "capacity": 292}


def test_a_shard_that_did_not_answer_adds_nothing_and_an_unavailable_engine_no_slots() -> None:
    restarting = {"status": "unavailable"}
    merged = merged_sessions([shard(3, 146, 146), None, restarting], shared_engines=True)
    assert (merged.live, merged.capacity) == (3, 146)
    down = shard(0, 0, 0)  # the engine process is restarting: no slots
    assert merged_sessions([down, down], shared_engines=True).capacity == 0


def test_reports_that_cross_in_flight_take_the_larger_slots() -> None:
    merged = merged_sessions([shard(0, 140, 140), shard(0, 146, 146)], shared_engines=True)
    assert merged.capacity == 146


@given(
    st.integers(1, 4),
    st.lists(st.integers(0, 300), min_size=1, max_size=3),
    st.lists(st.integers(0, 400), min_size=1, max_size=8),
    st.booleans(),
)
def test_capacity_never_exceeds_the_engines_or_the_shards(
    engines: int, slots: list[int], bounds: list[int], shared: bool
) -> None:
    slots = (slots * engines)[:engines]
    shards = [shard(0, min(bound, sum(slots)), *slots) for bound in bounds]
    merged = merged_sessions(shards, shared_engines=shared)
    distinct = sum(slots) * (1 if shared else len(bounds))
    assert merged.capacity == min(sum(min(b, sum(slots)) for b in bounds), distinct)
    assert merged.capacity <= distinct
    if shared:
        assert merged.capacity <= sum(slots)  # never a shared engine twice
