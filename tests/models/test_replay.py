"""Replays (prompt replays, any prefill) take extra steps in the slack between ticks: the
scheduler's numbers, the engine's replay steps, and the driver under MockClock with a
runner whose steps take mock time (a prefill of ``len(prompt.text)`` frames)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.models import (
    Engine,
    EngineDriver,
    EngineRecorder,
    FrameOutput,
    ModelSpec,
    Scheduler,
    SlotOutput,
    SlotPrompt,
    StepOutput,
    StepPlan,
)

from .models_support import FakeTimer, tone

SPEC = ModelSpec(name="prefill", max_slots=8, supports_prompts=True)
PERIOD = SPEC.frame_period_s
T = TypeVar("T")


async def inline(sync_fn: Callable[[], T]) -> T:
    """Run the step on the trio thread: MockClock moves only when the runner says."""
    await trio.lowlevel.checkpoint()
    return sync_fn()


class PrefillRunner:
    """A frame model with a prefill: a slot's first ``len(prompt.text)`` steps (again after
    a reset) take no input; then it echoes its input. Each step moves the mock clock and
    the engine's timer on by its cost: ``tick_s`` for a tick, ``replay_s`` for a replay step
    (one whose rows all replay), plus ``per_row_s`` a row."""

    def __init__(
        self,
        clock: trio.testing.MockClock | None,
        timer: FakeTimer,
        *,
        tick_s: float = 0.01,
        replay_s: float = 0.005,
        per_row_s: float = 0.001,
    ) -> None:
        self.clock = clock
        self.timer = timer
        self.tick_s, self.replay_s, self.per_row_s = tick_s, replay_s, per_row_s
        self.need = [0] * SPEC.max_slots
        self.done = [0] * SPEC.max_slots
        self.plans: list[tuple[bool, tuple[int, ...]]] = []
        """(replay step, its slots) per step."""

    @property
    def spec(self) -> ModelSpec:
        return SPEC

    def reset_slot(self, slot: int) -> None:
        self.done[slot] = 0

    def execute(self, plan: StepPlan) -> StepOutput:
        for slot in plan.new_slots:
            prompt = plan.new_prompts.get(slot)
            self.need[slot] = 0 if prompt is None or prompt.text is None else len(prompt.text)
        outputs = []
        for item in plan.inputs:
            slot = item.slot
            if self.done[slot] < self.need[slot]:
                assert item.held and item.frame is None
                self.done[slot] += 1
                silent = np.zeros(plan.frame_samples, dtype=np.float32)
                holds = self.done[slot] < self.need[slot]
                outputs.append(FrameOutput(slot, silent, holds_input=holds))
            else:
                frame = item.frame if item.frame is not None else np.zeros(1920, np.float32)
                outputs.append(FrameOutput(slot, frame.copy(), text=f"{slot}"))
        replay = all(item.held for item in plan.inputs)
        self.plans.append((replay, plan.live_slots))
        cost = (self.replay_s if replay else self.tick_s) + self.per_row_s * len(plan.inputs)
        self.timer.now += cost
        if self.clock is not None:
            self.clock.jump(cost)
        return StepOutput(tuple(outputs))


# -- the scheduler's numbers ---------------------------------------------------------------


def test_replay_steps_fit_the_time_left_by_measured_replay_steps() -> None:
    scheduler = Scheduler(8, PERIOD)
    assert scheduler.replay_step_s(2) is None
    assert scheduler.replay_steps(2, 0.05, limit=32) == 1  # a probe: nothing measured yet
    assert scheduler.replay_steps(0, 0.05, limit=32) == 0  # nothing replays
    assert scheduler.replay_steps(2, 0.0, limit=32) == 0  # no time
    scheduler.record_step(4, 0.03)  # a tick step bounds a replay step until one is measured
    assert scheduler.replay_steps(2, 0.07, limit=32) == 2  # as many as the bound fits
    assert scheduler.replay_steps(2, 0.02, limit=32) == 1  # none: a probe, in half the bound
    assert scheduler.replay_steps(2, 0.01, limit=32) == 0  # not even that
    assert scheduler.replay_step_s(2) == 0.015  # the probe's window
    for duration in [0.01] * 8 + [0.02] * 2:
        scheduler.record_replay_step(2, duration)
    assert scheduler.replay_step_s(2) == 0.02  # the 90th percentile, not the mean
    assert scheduler.replay_steps(2, 0.07, limit=32) == 3
    assert scheduler.replay_steps(2, 0.07, limit=2) == 2
    assert scheduler.replay_steps(2, 0.01, limit=32) == 0  # too short: none
    assert scheduler.replay_step_s(1) == 0.02  # a larger batch bounds a smaller one
    assert scheduler.replay_step_s(4) == pytest.approx(0.04)  # a smaller one, scaled by rows
    assert scheduler.replay_steps(2, math.inf, limit=5) == 5
    assert scheduler.statistics().window_steps == 1  # replay steps never reach admission


def test_a_slow_replay_step_stops_counting_after_the_horizon() -> None:
    scheduler = Scheduler(8, PERIOD)
    scheduler.record_replay_step(1, 0.07, now=0.0)  # one step on a busy host
    assert scheduler.replay_steps(1, 0.05, limit=32) == 0  # it keeps replays out
    scheduler.record_step(2, 0.01, now=5.0)
    assert scheduler.replay_steps(1, 0.05, limit=32) == 0  # still, within the horizon
    scheduler.record_step(2, 0.01, now=10.5)
    assert scheduler.replay_steps(1, 0.05, limit=32) == 5  # expired: the tick bound again


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.floats(0.0005, 0.05)), min_size=1, max_size=40),
    st.integers(1, 8),
    st.floats(0.0, 0.2),
    st.integers(1, 64),
)
def test_the_steps_granted_never_outlast_the_time_at_the_estimate(
    replays: list[tuple[int, float]], batch: int, time_s: float, limit: int
) -> None:
    scheduler = Scheduler(8, PERIOD)
    for size, duration in replays:
        scheduler.record_replay_step(size, duration)
    steps = scheduler.replay_steps(batch, time_s, limit)
    estimate = scheduler.replay_step_s(batch)
    assert estimate is not None and 0 <= steps <= limit
    assert steps * estimate <= time_s + 1e-12
    assert steps == limit or (steps + 1) * estimate > time_s  # as many as fit
    longer = scheduler.replay_steps(batch, time_s + estimate, limit)
    assert longer >= steps  # more time never grants fewer


# -- the engine's replay steps -------------------------------------------------------------


def test_replay_steps_take_only_the_replaying_slots_and_no_tick() -> None:
    timer = FakeTimer()
    runner = PrefillRunner(None, timer)
    engine = Engine(runner, timer=timer)
    live = engine.acquire_slot("live")
    a = engine.acquire_slot("a", SlotPrompt(text="x" * 5))
    b = engine.acquire_slot("b", SlotPrompt(text="x" * 2))
    assert live is not None and a is not None and b is not None
    engine.push_input(live, tone(1, 0))
    assert engine.replaying() == 2
    first = engine.step(0.0)  # the tick: every slot, the replaying ones held
    assert first[live].input_samples == 1920 and first[a].input_samples == 0
    steps = engine.replay(0.0, 10)  # b has 1 frame left, a 4: four steps, then none replays
    assert [set(step) for step in steps] == [{a, b}, {a}, {a}, {a}]
    assert not steps[0][b].frame.holds_input and not steps[-1][a].frame.holds_input
    assert all(out.frame.holds_input for step in steps[1:-1] for out in step.values())
    assert engine.replaying() == 0 and engine.replay(0.0, 10) == []
    stats = engine.statistics()
    assert (stats.ticks, stats.replay_steps) == (1, 4)
    assert stats.scheduler.window_steps == 1  # the tick; replay steps stay out of admission
    assert engine.replay_step_s() == 0.0  # nothing replays now
    engine.push_input(a, tone(2, 0))
    assert engine.step(0.0)[a].input_samples == 1920  # live: takes input at once


def test_a_tick_whose_every_slot_replays_measures_a_replay_step() -> None:
    timer = FakeTimer()
    engine = Engine(PrefillRunner(None, timer, tick_s=0.01, per_row_s=0.001), timer=timer)
    a = engine.acquire_slot("a", SlotPrompt(text="x" * 20))
    assert a is not None and engine.replay_step_s() == 0.0  # nothing measured
    engine.step(0.0)  # a tick of one replaying slot
    assert engine.replay_step_s() == pytest.approx(0.006)
    live = engine.acquire_slot("live")
    assert live is not None
    engine.step(0.08)  # a tick with a live slot: no replay evidence
    assert engine.replay_step_s() == pytest.approx(0.006)


def test_a_reset_slot_replays_again_in_replay_steps() -> None:
    timer = FakeTimer()
    engine = Engine(PrefillRunner(None, timer), timer=timer)
    a = engine.acquire_slot("a", SlotPrompt(text="xyz"))
    assert a is not None
    assert len(engine.replay(0.0, 10)) == 3
    engine.reset(a, epoch=1)
    assert engine.replaying() == 1
    steps = engine.replay(0.0, 10)
    assert len(steps) == 3 and all(step[a].epoch == 1 for step in steps)


# -- the driver: replays in the slack ------------------------------------------------------


def _channel() -> tuple[trio.MemorySendChannel[SlotOutput], trio.MemoryReceiveChannel[SlotOutput]]:
    return trio.open_memory_channel[SlotOutput](1024)


async def _collect(
    recv: trio.MemoryReceiveChannel[SlotOutput], into: list[tuple[float, SlotOutput]]
) -> None:
    async for out in recv:
        into.append((trio.current_time(), out))


async def test_a_replay_takes_fewer_ticks_than_frames_and_live_slots_miss_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = FakeTimer()
    runner = PrefillRunner(autojump_clock, timer)
    recorder = EngineRecorder("prefill", SPEC.max_slots)
    driver = EngineDriver(Engine(runner, timer=timer), offload=inline, recorder=recorder)
    got: dict[str, list[tuple[float, SlotOutput]]] = {n: [] for n in ("live", "j1", "j2")}
    sends = {name: _channel() for name in got}
    async with trio.open_nursery() as nursery:
        for name, (_, recv) in sends.items():
            nursery.start_soon(_collect, recv, got[name])
        start = trio.current_time()
        await nursery.start(driver.run)
        live = driver.attach("live", sends["live"][0])
        assert live is not None
        for k in range(60):
            driver.push_input(live, tone(1, k))
        await trio.sleep(2.5 * PERIOD)
        joined = trio.current_time()
        joiners = [
            driver.attach(n, sends[n][0], prompt=SlotPrompt(text="x" * 30)) for n in ["j1", "j2"]
        ]
        assert all(j is not None for j in joiners)
        await trio.sleep(20 * PERIOD)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert stats.late_ticks == 0 and stats.engine.slot_underruns[live.slot] == 0
    assert stats.engine.replay_steps > 0 and stats.replay_units > 0
    # the live slot: one output per tick, each on its grid time and received within it
    ticks = [out.tick for _, out in got["live"]]
    assert ticks == list(range(len(ticks))) and len(ticks) >= 22
    first = got["live"][0][1].at
    for received, out in got["live"]:
        assert out.at == pytest.approx(first + out.tick * PERIOD)
        assert received - out.at < PERIOD
    for name in ("j1", "j2"):
        outs = [out for _, out in got[name]]
        ready = next(i for i, out in enumerate(outs) if not out.frame.holds_input)
        held_ticks = sum(1 for out in outs[:ready] if out.frame.holds_input)
        assert held_ticks < 10 < 30  # 30 prefill frames, far fewer ticks
        ready_at = got[name][ready][0]
        assert ready_at - joined < 10 * PERIOD
        on_grid = (ready_at - start) / PERIOD
        assert abs(on_grid - round(on_grid)) > 0.05  # delivered between ticks, not at one
    # both joiners' replay steps shared batches, and no replay step ran during a tick
    both = [slots for replay, slots in runner.plans if replay and len(slots) == 2]
    assert both and driver.statistics().slack is None  # a private slack: nothing shares it
    assert recorder.ready.count == 2 and recorder.snapshot().ready[1] == pytest.approx(
        recorder.ready.sum
    )
    assert stats.replay_frames_skipped > 0


async def test_replays_wait_while_no_window_fits_a_step_and_resume_when_one_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = FakeTimer()
    # ticks of 56-58 ms (under admission's 64): windows of 20 ms, and before any replay step
    # is measured a tick step's time is the estimate of one (an upper bound): none fits
    runner = PrefillRunner(autojump_clock, timer, tick_s=0.055, replay_s=0.005)
    driver = EngineDriver(Engine(runner, timer=timer), offload=inline)
    live_send, live_recv = _channel()
    slow_send, slow_recv = _channel()
    fast_send, fast_recv = _channel()
    got: dict[str, list[tuple[float, SlotOutput]]] = {"live": [], "slow": [], "fast": []}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, live_recv, got["live"])
        nursery.start_soon(_collect, slow_recv, got["slow"])
        nursery.start_soon(_collect, fast_recv, got["fast"])
        await nursery.start(driver.run)
        live = driver.attach("live", live_send)
        assert live is not None
        for k in range(200):
            driver.push_input(live, tone(1, k))
        await trio.sleep(3 * PERIOD)
        slow = driver.attach("slow", slow_send, prompt=SlotPrompt(text="x" * 12))
        assert slow is not None
        await trio.sleep(14 * PERIOD)
        assert driver.statistics().engine.replay_steps == 0  # no window fits the estimate
        runner.tick_s = 0.01  # the ticks got cheap: the windows widen
        await trio.sleep(20 * PERIOD)
        fast = driver.attach("fast", fast_send, prompt=SlotPrompt(text="x" * 12))
        assert fast is not None
        await trio.sleep(6 * PERIOD)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert stats.late_ticks == 0
    slow_outs = [out for _, out in got["slow"]]
    assert sum(out.frame.holds_input for out in slow_outs) == 11  # one frame per tick: 12 ticks
    assert not slow_outs[11].frame.holds_input
    fast_outs = [out for _, out in got["fast"]]
    ready = next(i for i, out in enumerate(fast_outs) if not out.frame.holds_input)
    assert ready <= 2 and stats.engine.replay_steps >= 9  # in the slack, once windows fit
    assert stats.slack is None


async def test_a_probe_step_is_the_first_evidence_where_the_tick_bound_fits_no_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = FakeTimer()
    # ticks of 41-42 ms: windows of 36 ms; the tick bound fits none, but half of it does
    runner = PrefillRunner(autojump_clock, timer, tick_s=0.04, replay_s=0.005)
    driver = EngineDriver(Engine(runner, timer=timer), offload=inline)
    live_send, live_recv = _channel()
    send, recv = _channel()
    got: list[tuple[float, SlotOutput]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, recv, got)
        nursery.start_soon(_collect, live_recv, [])
        await nursery.start(driver.run)
        live = driver.attach("live", live_send)
        assert live is not None
        for k in range(100):
            driver.push_input(live, tone(1, k))
        await trio.sleep(3 * PERIOD)
        assert driver.attach("a", send, prompt=SlotPrompt(text="x" * 40)) is not None
        await trio.sleep(12 * PERIOD)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert stats.late_ticks == 0 and stats.engine.replay_steps >= 30
    ready = next(i for i, (_, out) in enumerate(got) if not out.frame.holds_input)
    assert ready < 10  # 40 frames


async def test_the_one_frame_per_tick_replay_is_still_there_when_asked_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = FakeTimer()
    runner = PrefillRunner(autojump_clock, timer)
    driver = EngineDriver(Engine(runner, timer=timer), offload=inline, replay_in_slack=False)
    send, recv = _channel()
    got: list[tuple[float, SlotOutput]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, recv, got)
        await nursery.start(driver.run)
        assert driver.attach("a", send, prompt=SlotPrompt(text="x" * 8)) is not None
        await trio.sleep(10.5 * PERIOD)
        nursery.cancel_scope.cancel()
    holds = [out.frame.holds_input for _, out in got]
    assert holds[:8] == [True] * 7 + [False] and driver.statistics().engine.replay_steps == 0
    with pytest.raises(ValueError, match="max_replay_steps"):
        EngineDriver(Engine(PrefillRunner(None, FakeTimer())), max_replay_steps=0)
