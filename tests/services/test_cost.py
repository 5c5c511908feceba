"""The cost estimate and the media budget (``duplex/services/_cost.py``), sans-I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.refusals import Refusal
from duplex.services import (
    Cost,
    CostBudget,
    CostLease,
    DiffusionCost,
    DiffusionShape,
    default_media_memory_bytes,
    speech_audio_refusal,
    speech_audio_seconds,
)

GIB = 2**30


def test_the_issues_requests_cost_what_they_held() -> None:
    cost = DiffusionCost()
    video = cost.estimate(DiffusionShape(2048, 2048, 1, frames=16))
    images = cost.estimate(DiffusionShape(2048, 2048, 1, n=10))
    assert 7.9e9 <= video.memory_bytes <= 9.5e9  # held +7.9 GB
    assert 3.9e9 <= images.memory_bytes <= 6e9  # held +3.9 GB
    # 512x512 at 20 steps ran 630 s; 64x64 at 20 steps 0.55 s (an idle host)
    assert cost.estimate(DiffusionShape(512, 512, 20)).seconds > 300
    assert cost.estimate(DiffusionShape(64, 64, 20)).seconds < 5


def test_the_rate_follows_measured_runs_and_forgets_them_past_the_horizon() -> None:
    now = [0.0]
    cost = DiffusionCost(seconds_per_unit=1e-6, horizon_s=100.0, clock=lambda: now[0])
    shape = DiffusionShape(64, 64, 2)
    prior = cost.estimate(shape).seconds
    cost.observe(shape, 10 * prior)  # this device is ten times slower than the prior
    assert cost.estimate(shape).seconds == pytest.approx(10 * prior)
    cost.observe(shape, -1.0)  # nonsense is ignored
    assert cost.estimate(shape).seconds == pytest.approx(10 * prior)
    now[0] = 101.0
    assert cost.estimate(shape).seconds == pytest.approx(prior)


def test_one_slow_run_among_many_does_not_set_the_rate() -> None:
    cost = DiffusionCost(seconds_per_unit=1e-6)
    shape = DiffusionShape(64, 64, 2)
    units = cost.estimate(shape).seconds / 1e-6
    for _ in range(19):
        cost.observe(shape, units * 2e-6)
    cost.observe(shape, units * 1e-3)  # a descheduled outlier
    assert cost.seconds_per_unit == pytest.approx(2e-6)


def test_the_budget_refuses_each_way_and_admits_once_the_cause_is_gone() -> None:
    budget = CostBudget(memory_bytes=3 * 2**20, max_seconds=60.0)
    cost = DiffusionCost()
    shape = DiffusionShape(128, 128, 2)  # 2 MiB
    first = budget.admit(cost.estimate(shape), shape)
    assert isinstance(first, CostLease)
    busy = budget.admit(cost.estimate(shape), shape)
    assert isinstance(busy, Refusal) and (busy.status, busy.code, busy.param) == (
        429,
        "rate_limited",
        "size",
    )
    assert busy.retry_after_s is not None
    budget.release(first)
    budget.release(first)  # twice: once counted
    again = budget.admit(cost.estimate(shape), shape)
    assert isinstance(again, CostLease)
    budget.release(again)

    big = DiffusionShape(256, 256, 1, frames=2, param="width")  # 16 MiB alone
    alone = budget.admit(cost.estimate(big), big)
    assert isinstance(alone, Refusal) and (alone.status, alone.param) == (413, "width")
    assert "media.memory_budget_mb" in alone.message and "256x256" in alone.message
    slow = DiffusionShape(64, 64, 500, frames=1)
    ceiling = CostBudget(memory_bytes=GIB, max_seconds=1.0)
    too_slow = ceiling.admit(cost.estimate(slow), slow)
    assert isinstance(too_slow, Refusal) and (too_slow.status, too_slow.code) == (
        400,
        "request_too_slow",
    )
    assert "media.max_request_s" in too_slow.message
    record = budget.statistics()
    assert (record.held_bytes, record.leases, record.peak_bytes) == (0, 0, 2 * 2**20)
    assert (record.refused_busy, record.refused_memory) == (1, 1)


@given(st.lists(st.integers(1, 2**22), max_size=30), st.integers(2**20, 2**26))
def test_admitted_leases_never_hold_more_than_the_budget(sizes: list[int], limit: int) -> None:
    budget = CostBudget(memory_bytes=limit, max_seconds=1.0)
    leases = []
    for index, size in enumerate(sizes):
        lease = budget.admit(Cost(size, 0.1))
        if isinstance(lease, CostLease):
            leases.append(lease)
        assert budget.statistics().held_bytes <= limit
        if index % 3 == 2 and leases:
            budget.release(leases.pop(0))
    for lease in leases:
        budget.release(lease)
    assert budget.statistics().held_bytes == 0


def test_speech_audio_is_estimated_long_and_bounded_per_request_or_batch() -> None:
    assert speech_audio_seconds(120, 1.0) == pytest.approx(10.0)
    assert speech_audio_seconds(120, 0.25) == pytest.approx(40.0)
    assert speech_audio_refusal([(4096, 1.0)], 24000, 600.0) is None  # OpenAI's longest
    issue = speech_audio_refusal([(2048, 0.25)] * 4, 48000, 600.0)
    assert isinstance(issue, Refusal)
    assert (issue.status, issue.code, issue.param) == (400, "audio_too_long", "input")
    assert "speech.max_audio_s" in issue.message


def test_the_default_memory_budget_is_a_quarter_of_the_machine() -> None:
    assert default_media_memory_bytes(24 * GIB) == 6 * GIB
    assert default_media_memory_bytes(0) == 256 * 2**20
