from __future__ import annotations

import pytest

from duplex.models import CapacityLimit, Scheduler, SlotState

PERIOD = 0.08
BUDGET = 0.8 * PERIOD


def test_allocates_lowest_free_id_and_holds_releasing_ids() -> None:
    s = Scheduler(3, PERIOD)
    assert [s.allocate(), s.allocate()] == [0, 1]
    s.release(0)
    assert s.state(0) is SlotState.RELEASING
    assert s.allocate() == 2  # 0 is held until the runner has reset it
    assert s.allocate() is None
    s.free(0)
    assert s.allocate() == 0
    stats = s.statistics()
    assert (stats.live, stats.releasing, stats.free) == (3, 0, 0)


def test_release_and_free_check_state() -> None:
    s = Scheduler(2, PERIOD)
    with pytest.raises(ValueError):
        s.release(0)
    slot = s.allocate()
    assert slot is not None
    with pytest.raises(ValueError):
        s.free(slot)
    with pytest.raises(ValueError):
        s.release(7)


def test_admission_by_slots() -> None:
    s = Scheduler(2, PERIOD)
    assert s.can_admit()
    s.allocate()
    s.allocate()
    assert not s.can_admit()


def test_admission_by_measured_p99_step_time() -> None:
    s = Scheduler(16, PERIOD, min_samples=10)
    for batch in (1, 2, 3):
        for _ in range(20):
            s.record_step(batch, 0.01 * batch)
    assert s.capacity() == 16  # nothing measured over budget: probe upward
    for _ in range(20):
        s.record_step(4, BUDGET * 1.1)
    assert s.capacity() == 3
    for _ in range(3):
        s.allocate()
    assert not s.can_admit() and s.allocate() is None


def test_p99_ignores_one_outlier_in_a_hundred_but_not_two() -> None:
    s = Scheduler(8, PERIOD, min_samples=10)
    for _ in range(99):
        s.record_step(2, 0.01)
    s.record_step(2, 1.0)
    assert s.capacity() == 8
    s.record_step(2, 1.0)
    assert s.capacity() == 1


def test_too_few_samples_do_not_count() -> None:
    s = Scheduler(8, PERIOD, min_samples=10)
    for _ in range(9):
        s.record_step(1, 1.0)
    assert s.capacity() == 8
    s.record_step(1, 1.0)
    assert s.capacity() == 1  # a batch of one over budget: one session still runs (the probe)
    assert s.allocate() is not None and not s.can_admit()


def test_over_budget_size_ages_out_of_the_window() -> None:
    s = Scheduler(8, PERIOD, window=32, min_samples=4)
    for _ in range(8):
        s.record_step(5, 1.0)
    assert s.capacity() == 4
    for _ in range(32):
        s.record_step(2, 0.001)
    report = s.report()
    assert (report.slots, report.limit, report.over_batch) == (5, CapacityLimit.PROBE, 5)
    stats = s.statistics()
    assert stats.window_steps == 32 and stats.p99_step_s == pytest.approx(0.001)
    assert stats.budget_s == pytest.approx(BUDGET)
    for _ in range(4):  # the probe measures batch 5 again, and it fits now
        s.record_step(5, 0.001)
    assert s.capacity() == 8 and s.report().limit is CapacityLimit.POOL


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Scheduler(0, PERIOD)
    with pytest.raises(ValueError):
        Scheduler(1, PERIOD, deadline_fraction=1.5)
    with pytest.raises(ValueError):
        Scheduler(1, PERIOD).record_step(0, 0.1)


def test_phases_split_the_budget_and_multiply_capacity() -> None:
    """Four phase groups: a step has a quarter of the period, and holds a quarter of the
    slots, so the smallest over-budget batch b* caps capacity at 4 * (b* - 1)."""
    s = Scheduler(64, PERIOD, phases=4, min_samples=10)
    assert s.budget_s == pytest.approx(BUDGET / 4)
    for _ in range(20):
        s.record_step(3, BUDGET / 4 * 0.9)
        s.record_step(4, BUDGET / 4 * 1.1)
    assert s.capacity() == 12


def test_a_capture_sized_first_step_alone_never_locks_admission() -> None:
    """The served GPU path: the first step took 2.06 s (CUDA graph capture), then every
    step fit. One slow step is no evidence (``min_slow``); today's rule zeroed capacity."""
    s = Scheduler(16, PERIOD)
    s.record_step(1, 2.06, now=0.0)
    for k in range(1, 40):
        s.record_step(1, 0.01, now=k * PERIOD)
    assert s.capacity(now=40 * PERIOD) == 16
    assert s.report().limit is CapacityLimit.POOL


def test_capacity_never_stays_zero_with_no_live_slot() -> None:
    s = Scheduler(16, PERIOD, min_samples=4)
    for k in range(8):
        s.record_step(1, 1.0, now=k * PERIOD)  # a batch of one, always over budget
    report = s.report()
    assert report.slots == 1 and report.admits and report.over_batch == 1
    assert report.over_p99_s == pytest.approx(1.0)
    slot = s.allocate()
    assert slot is not None and not s.can_admit()
    s.release(slot)
    s.free(slot)
    assert s.can_admit()


def test_a_transient_stall_is_forgotten_after_the_window() -> None:
    """A stall (a GC pause of a few steps) caps capacity; ``window_s`` later it no longer
    counts, even though no step ran meanwhile (the engine was idle)."""
    s = Scheduler(8, PERIOD, window_s=30.0, min_samples=4)
    for k in range(20):
        s.record_step(3, 0.01, now=k * PERIOD)
    for k in range(20, 23):
        s.record_step(3, 0.5, now=k * PERIOD)
    assert s.capacity(now=2.0) == 2
    assert s.capacity(now=2.0 + 29.0) == 2
    # the evidence has left the window: one more than it allowed probes batch 3 again
    report = s.report(now=23 * PERIOD + 30.5)
    assert (report.slots, report.limit) == (3, CapacityLimit.PROBE)
    for k in range(4):
        s.record_step(3, 0.01, now=40.0 + k * PERIOD)
    assert s.capacity(now=41.0) == 8


def test_a_probe_that_is_still_over_budget_caps_again() -> None:
    s = Scheduler(8, PERIOD, window_s=10.0, min_samples=4)
    for k in range(6):
        s.record_step(4, 0.5, now=k * PERIOD)
    assert s.capacity(now=1.0) == 3
    assert s.capacity(now=20.0) == 4  # the probe
    for k in range(4):
        s.record_step(4, 0.5, now=20.0 + k * PERIOD)
    report = s.report(now=21.0)
    assert (report.slots, report.limit, report.over_batch) == (3, CapacityLimit.STEP_TIME, 4)


def test_old_steps_leave_the_p99_and_the_statistics() -> None:
    s = Scheduler(8, PERIOD, window_s=5.0)
    s.record_step(1, 0.5, now=0.0)
    s.record_step(1, 0.01, now=4.0)
    assert s.statistics(now=4.0).max_step_s == pytest.approx(0.5)
    stats = s.statistics(now=6.0)
    assert stats.window_steps == 1 and stats.max_step_s == pytest.approx(0.01)
