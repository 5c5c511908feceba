from __future__ import annotations

import pytest

from duplex.models import Scheduler, SlotState

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
    assert s.capacity() == 0 and not s.can_admit()


def test_over_budget_size_ages_out_of_the_window() -> None:
    s = Scheduler(8, PERIOD, window=32, min_samples=4)
    for _ in range(8):
        s.record_step(5, 1.0)
    assert s.capacity() == 4
    for _ in range(32):
        s.record_step(2, 0.001)
    assert s.capacity() == 8
    stats = s.statistics()
    assert stats.window_steps == 32 and stats.p99_step_s == pytest.approx(0.001)
    assert stats.budget_s == pytest.approx(BUDGET)


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
