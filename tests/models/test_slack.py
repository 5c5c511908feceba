"""Batch units in the slack between realtime ticks: the `Slack` rule under MockClock, a
`RequestEngine` sharing a process with a ticking `EngineDriver`, and a multi-unit runner
whose thread waits for windows between its units."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from duplex.exceptions import RequestCancelled, RequestFailed
from duplex.models import (
    EngineDriver,
    RequestEngine,
    Slack,
    SlackStatistics,
    UnitEstimate,
    UnitGate,
)
from duplex.models._driver import inline

from .models_support import SPEC, loopback_engine, tone

PERIOD = SPEC.frame_period_s
T = TypeVar("T")


# -- the rule ------------------------------------------------------------------------------


def test_the_estimate_is_a_high_quantile_of_the_recent_units_after_the_first() -> None:
    now = [0.0]
    estimate = UnitEstimate(window=10, quantile=0.9, clock=lambda: now[0])
    estimate.record(5.0)  # the first unit warms up: not counted
    assert estimate.seconds == 0.0
    estimate.record(0.02)
    assert estimate.seconds == 0.02
    for _ in range(8):
        estimate.record(0.01)
    estimate.record(0.05)  # one outlier in ten: the 90th percentile is the longest
    assert estimate.seconds == 0.05
    estimate.record(0.01)  # ten again, the 0.02 gone: the outlier is still the estimate
    assert estimate.seconds == 0.05
    for _ in range(9):
        estimate.record(0.01)
    assert estimate.seconds == 0.01  # the outlier left the window


def test_an_old_unit_time_expires_so_a_starved_runner_probes_again() -> None:
    now = [0.0]
    estimate = UnitEstimate(window=16, horizon_s=10.0, clock=lambda: now[0])
    estimate.record(0.0)
    estimate.record(0.060)  # fits no window
    now[0] = 9.9
    assert estimate.seconds == 0.060
    now[0] = 10.1
    assert estimate.seconds == 0.0  # one probe may go


async def test_a_window_fits_a_unit_only_between_steps_and_before_the_next_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slack = Slack(margin_s=0.002)
    assert slack.fits(10.0) and not slack.realtime  # no realtime work: open
    now = trio.current_time()
    slack.step_started()
    assert not slack.fits(0.0)  # never during a step
    slack.step_ended(now + 0.080)
    assert slack.fits(0.078) and not slack.fits(0.0781)  # the margin is kept
    await trio.sleep(0.050)
    assert slack.fits(0.028) and not slack.fits(0.029)  # the window shrinks with time
    slack.idle()
    assert slack.fits(10.0)


async def test_while_realtime_runs_one_unit_at_a_time_and_without_it_many(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slack = Slack()
    await slack.acquire(0.01)
    await slack.acquire(0.01)  # idle: a second unit may overlap
    slack.release()
    slack.release()
    slack.step_started()
    slack.step_ended(trio.current_time() + 1.0)
    await slack.acquire(0.01)
    assert not slack.fits(0.01)
    slack.release()
    assert slack.fits(0.01)


async def test_a_unit_that_fits_no_window_waits_for_one_and_is_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slack = Slack(margin_s=0.0)
    started: list[float] = []

    async def unit() -> None:
        await slack.acquire(0.050)
        started.append(trio.current_time())
        slack.release()

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        slack.step_started()
        slack.step_ended(t0 + 0.040)  # a 40 ms window: too short
        nursery.start_soon(unit)
        await trio.sleep(0.040)
        assert started == []
        slack.step_started()
        await trio.sleep(0.010)
        assert started == []  # never during a step
        slack.step_ended(trio.current_time() + 0.060)  # wide enough
    assert started == [pytest.approx(t0 + 0.050)]
    assert slack.statistics().deferred == 1 and slack.statistics().units == 1


async def test_a_unit_running_when_a_step_starts_is_counted_as_an_overrun(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slack = Slack()
    await slack.acquire(0.0)
    slack.step_started()
    slack.release()
    assert slack.statistics().overran == 1


async def test_a_unit_beside_steps_needs_a_window_but_not_one_it_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A unit on a lower-priority device stream starts in any window, however short, and
    runs on into the next step, which is counted as ``beside`` (not an overrun); it never
    starts during a step, and while realtime work is live it waits for another unit."""
    slack = Slack(margin_s=0.002)
    now = trio.current_time()
    slack.step_started()
    assert not slack.fits(0.0, beside_steps=True)  # never during a step
    slack.step_ended(now + 0.010)  # a 10 ms window
    assert slack.fits(1.0, beside_steps=True) and not slack.fits(1.0)
    await slack.acquire(1.0, beside_steps=True)
    assert not slack.fits(0.0, beside_steps=True)  # one unit at a time
    slack.step_started()  # the next step starts with it running: it may
    slack.release(beside_steps=True)
    assert slack.statistics() == SlackStatistics(units=1, deferred=0, overran=0, steps=2, beside=1)
    slack.step_ended(trio.current_time() + 0.080)
    await slack.acquire(0.050)  # a windowed unit (a malloc trim) still needs the fit
    slack.step_started()
    slack.release()
    assert slack.statistics().beside == 1 and slack.statistics().overran == 1


async def test_a_windowed_unit_waits_for_a_beside_unit_and_the_reverse(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slack = Slack(margin_s=0.0)
    order: list[str] = []

    async def unit(name: str, beside: bool, seconds: float) -> None:
        await slack.acquire(0.010, beside_steps=beside)
        order.append(name)
        await trio.sleep(seconds)
        order.append(f"/{name}")
        slack.release(beside_steps=beside)

    slack.step_started()
    slack.step_ended(trio.current_time() + 1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(unit, "beside", True, 0.030)
        await trio.sleep(0.001)
        nursery.start_soon(unit, "windowed", False, 0.010)
    assert order == ["beside", "/beside", "windowed", "/windowed"]


# -- a request engine beside a ticking engine (MockClock) ------------------------------------


class Units:
    """A runner of single-unit batches: each batch's run is timed by ``offload``."""

    name = "units"
    max_batch = 4

    def __init__(self) -> None:
        self.calls = 0

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        self.calls += 1
        return [r * 10 for r in requests]


def timed(spans: list[tuple[float, float]], seconds: float) -> Callable[..., Any]:
    """An offload that takes ``seconds`` of (mock) time and records when it ran."""

    async def offload(fn: Callable[[], T]) -> T:
        start = trio.current_time()
        await trio.sleep(seconds)
        spans.append((start, trio.current_time()))
        return fn()

    return offload


def overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s0, e0 in a for s1, e1 in b if s0 < e1 - 1e-12 and s1 < e0 - 1e-12)


@dataclass
class Ticked:
    """What `tick_beside_batches` ran: spans of steps and of batches, answers, counters."""

    slack: Slack
    driver: EngineDriver
    steps: list[tuple[float, float]]
    units: list[tuple[float, float]]
    answers: list[int]


async def tick_beside_batches(runner: Units, unit_s: float) -> Ticked:
    """A 30 ms step every 80 ms for 25 frames while a client a frame submits to ``runner``,
    whose batches take ``unit_s`` (mock time)."""
    slack = Slack()
    steps: list[tuple[float, float]] = []
    units: list[tuple[float, float]] = []
    driver = EngineDriver(loopback_engine(), offload=timed(steps, 0.030), slack=slack)
    send, _recv = trio.open_memory_channel[Any](64)
    handle = driver.attach("a", send)
    assert handle is not None
    engine = RequestEngine(
        runner, max_wait_s=0.0, slack=slack, offload=timed(units, unit_s), timer=trio.current_time
    )
    answers: list[int] = []

    async def client(i: int) -> None:
        answers.append(await engine.submit(i))

    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await nursery.start(engine.run)
        for k in range(25):
            driver.push_input(handle, tone(1, k))
            nursery.start_soon(client, k)
            await trio.sleep(PERIOD)
        nursery.cancel_scope.cancel()
    return Ticked(slack, driver, steps, units, answers)


async def test_batches_run_only_in_the_windows_and_no_tick_is_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 30 ms step every 80 ms and 20 ms batches: the batches go in the gaps, every tick
    keeps its time, and the batch work still gets done."""
    ran = await tick_beside_batches(Units(), 0.020)
    answers, slack = ran.answers, ran.slack
    assert sorted(answers) == [k * 10 for k in range(len(answers))] and len(answers) >= 20
    assert len(ran.steps) >= 24 and len(ran.units) >= 10
    assert overlaps(ran.steps, ran.units) == 0
    assert ran.driver.statistics().late_ticks == 0
    assert slack.statistics().overran == 0
    figures = ran.driver.statistics()  # exported with the engine's metrics
    assert figures.metric("duplex_engine_slack_units_total") == slack.statistics().units >= 10
    assert figures.metric("duplex_engine_slack_overran_total") == 0


class BesideUnits(Units):
    """`Units` whose device work runs below the realtime stream (`priority_stream`)."""

    beside_realtime = True


async def test_a_runner_beside_realtime_runs_during_steps_and_no_tick_is_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The same load as above, the runner declaring ``beside_realtime``: its 60 ms batches
    (wider than any 50 ms window) start between steps and run on beside the next, and
    the ticks keep their time."""
    ran = await tick_beside_batches(BesideUnits(), 0.060)
    assert len(ran.answers) >= 20 and len(ran.units) >= 20
    assert overlaps(ran.steps, ran.units) >= 10
    assert ran.driver.statistics().late_ticks == 0
    statistics = ran.slack.statistics()
    assert statistics.overran == 0 and statistics.beside >= 3 and statistics.deferred == 0
    assert ran.driver.statistics().metric("duplex_engine_slack_beside_total") == statistics.beside


async def test_the_window_opens_only_after_a_ticks_outputs_are_handed_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Delivery and the tick's hook run with the slack still closed: a batch unit's thread
    would otherwise take the GIL while the outputs are encoded and posted."""
    slack = Slack()
    seen: list[bool] = []
    delivered: list[object] = []

    class Recording:
        def send_nowait(self, output: object, /) -> None:
            delivered.append(output)
            seen.append(slack.fits(0.001))

    driver = EngineDriver(loopback_engine(), offload=inline, slack=slack)  # MockClock: no thread
    driver.on_tick = lambda: seen.append(slack.fits(0.001))
    handle = driver.attach("a", Recording())
    assert handle is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        for k in range(6):
            driver.push_input(handle, tone(1, k))
            await trio.sleep(PERIOD)
        nursery.cancel_scope.cancel()
    assert delivered and len(seen) >= 6  # an output, and the hook of every tick
    assert not any(seen)


async def test_a_unit_too_long_for_any_window_waits_probes_and_runs_when_realtime_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """60 ms units beside 30 ms steps (50 ms windows): the first (warm-up, not counted) and
    the second (measured) run and overlap a step; then units wait, one probe goes per
    10 s horizon, and the rest run as soon as the slot is released."""
    slack = Slack()
    steps: list[tuple[float, float]] = []
    units: list[tuple[float, float]] = []
    driver = EngineDriver(loopback_engine(), offload=timed(steps, 0.030), slack=slack)
    send, _recv = trio.open_memory_channel[Any](100000)
    handle = driver.attach("a", send)
    assert handle is not None
    runner = Units()
    runner.max_batch = 1
    engine = RequestEngine(
        runner, max_wait_s=0.0, slack=slack, offload=timed(units, 0.060), timer=trio.current_time
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await nursery.start(engine.run)
        for k in range(5):
            nursery.start_soon(engine.submit, k)
        await trio.sleep(1.0)
        assert runner.calls == 2  # then never fits a 50 ms window
        assert slack.statistics().deferred >= 1
        await trio.sleep(10.0)
        assert runner.calls == 3  # the 60 ms measure expired: one probe
        assert slack.statistics().overran == 3
        driver.detach(handle)
        await trio.sleep(0.5)
        assert runner.calls == 5  # realtime idle: the rest ran
        nursery.cancel_scope.cancel()
    assert overlaps(steps, units) == 3


# -- a multi-unit runner in a worker thread ------------------------------------------------


class Steps:
    """A runner whose batch is ``units`` steps of ``unit_s`` each, with a gate between them;
    it records, for each step, whether a realtime step was running when it began."""

    name = "steps"
    max_batch = 2

    def __init__(self, slack: Slack, units: int, unit_s: float) -> None:
        self.slack = slack
        self.units = units
        self.unit_s = unit_s
        self.began_during_a_step: list[bool] = []

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        for unit in range(self.units):
            if unit:
                gate.next_unit()
            self.began_during_a_step.append(self.slack.stepping)
            time.sleep(self.unit_s)
        return list(requests)


async def test_a_threaded_runner_waits_for_a_window_between_its_units() -> None:
    """30 ms steps in a worker thread every 80 ms, 5 ms units: no unit begins mid-step
    (ungated, about a third of them would)."""
    slack = Slack()

    def slow_step(fn: Callable[[], T]) -> T:
        time.sleep(0.030)
        return fn()

    async def stepping(fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(slow_step, fn)

    driver = EngineDriver(loopback_engine(), offload=stepping, slack=slack)
    send, _recv = trio.open_memory_channel[Any](1000)
    handle = driver.attach("a", send)
    assert handle is not None
    runner = Steps(slack, units=8, unit_s=0.005)
    engine = RequestEngine(runner, max_wait_s=0.0, slack=slack)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await nursery.start(engine.run)
        results = [await engine.submit(k) for k in range(3)]
        nursery.cancel_scope.cancel()
    assert results == [0, 1, 2]
    assert len(runner.began_during_a_step) == 24
    assert not any(runner.began_during_a_step)
    assert slack.statistics().steps > 0


@pytest.mark.parametrize("realtime", [True, False])
async def test_a_unit_that_fits_the_window_held_goes_on_in_it_without_a_hop(
    realtime: bool,
) -> None:
    """Six 2 ms units in a worker thread: inside one long window they all run in it (one
    window taken: no hop to the event loop between them); with no realtime work (``until``
    is inf) each unit takes a window, so sessions that start meanwhile are seen."""
    slack = Slack()
    if realtime:
        slack.step_started()
        slack.step_ended(trio.current_time() + 5.0)
    runner = Steps(slack, units=6, unit_s=0.002)
    engine = RequestEngine(runner, max_wait_s=0.0, slack=slack)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        assert await engine.submit(1) == 1
        nursery.cancel_scope.cancel()
    assert len(runner.began_during_a_step) == 6
    assert slack.statistics().units == (1 if realtime else 6)


async def test_a_batch_whose_clients_all_left_stops_at_its_next_unit() -> None:
    slack = Slack()
    runner = Steps(slack, units=50, unit_s=0.01)
    engine = RequestEngine(runner, max_wait_s=0.0, slack=slack)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.move_on_after(0.05):
            await engine.submit(1)
        with trio.fail_after(5):
            while engine.statistics().stopped_batches == 0:
                await trio.sleep(0.01)
        assert len(runner.began_during_a_step) < 50
        nursery.cancel_scope.cancel()
    stats = engine.statistics()
    assert stats.orphaned == 1 and stats.failed_requests == 0


async def test_a_runner_that_raises_request_cancelled_for_live_clients_fails_them() -> None:
    """`RequestCancelled` from a runner whose clients are still there is still an answer."""

    class Quits:
        name = "quits"
        max_batch = 1

        def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
            raise RequestCancelled("the runner gave up")

    engine = RequestEngine(Quits(), max_wait_s=0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with pytest.raises(RequestFailed):
            await engine.submit(1)
        nursery.cancel_scope.cancel()


async def test_each_kind_of_unit_has_its_own_estimate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two 1 ms steps, then a 5 ms decode: the decode's cost does not raise the steps'
    estimate (so steps keep fitting narrow windows), and the decode waits for its own."""
    now = [0.0]

    class Kinds:
        name = "kinds"
        max_batch = 1

        def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
            now[0] += 0.001  # the first unit: a step
            gate.next_unit("step")
            now[0] += 0.001
            gate.next_unit("decode")
            now[0] += 0.005
            return list(requests)

    engine = RequestEngine(Kinds(), max_wait_s=0.0, offload=inline, timer=lambda: now[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        assert [await engine.submit(k) for k in range(4)] == [0, 1, 2, 3]
        nursery.cancel_scope.cancel()
    assert engine.unit_estimate("step").seconds == pytest.approx(0.001)
    assert engine.unit_estimate("decode").seconds == pytest.approx(0.005)


async def test_time_left_is_the_open_window_less_its_margin(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slack = Slack(margin_s=0.002)
    assert slack.time_left() == math.inf  # no realtime work: the window never closes
    now = trio.current_time()
    slack.step_started()
    assert slack.time_left() == 0.0
    slack.step_ended(now + 0.020)
    assert slack.time_left() == pytest.approx(0.018)
    assert slack.time_left(0.0005) == pytest.approx(0.0195)  # an elastic unit's own margin
    assert slack.fits(0.019, elastic=True) and not slack.fits(0.019)
    await trio.sleep(0.019)
    assert slack.time_left() == 0.0  # past the margin: nothing left, never negative
    slack.idle()
    assert slack.time_left() == math.inf


async def test_an_elastic_runner_needs_only_its_least_unit_and_is_told_the_windows_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A runner that can stop at any moment (``elastic_unit_s``): a unit starts in a 1.5 ms
    window (less than the slack's 2 ms margin) after one took 50 ms (a unit-sized estimate
    would wait for a wider one), and the gate says when to end it (``until``: its own 1 ms
    before the tick; ``inf`` while nothing realtime runs)."""
    now = [100.0]
    seen: list[float] = []

    class Elastic:
        name = "elastic"
        max_batch = 1
        elastic_unit_s = 0.001

        def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
            seen.append(gate.until)
            now[0] += 0.050  # ran on until its window closed
            return list(requests)

    slack = Slack(margin_s=0.002)
    engine = RequestEngine(
        Elastic(), max_wait_s=0.0, slack=slack, offload=inline, timer=lambda: now[0]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        assert [await engine.submit(k) for k in range(2)] == [0, 1]
        assert seen == [math.inf, math.inf]
        slack.step_started()
        slack.step_ended(trio.current_time() + 0.0015)
        started = trio.current_time()
        with trio.fail_after(1):  # a 50 ms estimate would never fit: this would time out
            assert await engine.submit(2) == 2
        assert trio.current_time() == started
        assert seen[2] == pytest.approx(now[0] - 0.050 + 0.0005)  # the window less 1 ms
        nursery.cancel_scope.cancel()
