"""EngineRecorder: tick lateness from the driver, step time by batch bucket from the engine."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TypeVar

import pytest
import trio
import trio.testing

from duplex.metrics import MetricsRegistry
from duplex.models import Engine, EngineDriver, EngineRecorder, LoopbackRunner, StepOutput, StepPlan
from duplex.models._recorder import ENGINE_HISTOGRAMS, TICK_LATENESS_BUCKETS, batch_bucket

from .models_support import SPEC, FakeTimer, WrappedLoopback, tone

PERIOD = SPEC.frame_period_s
T = TypeVar("T")


def test_batch_buckets_are_the_next_power_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [
        1, 2, 4, 4, 8, 8, 16, 64, 128,
    ]  # fmt: skip
    recorder = EngineRecorder("m", max_slots=8)
    assert len(recorder.steps) == 4  # batch 1, 2, 4, 8
    with pytest.raises(ValueError, match="max_slots"):
        EngineRecorder("m", max_slots=0)


def test_every_cell_is_exported_before_any_step() -> None:
    registry = MetricsRegistry()
    EngineRecorder("m", max_slots=5, registry=registry)
    text = registry.render()
    for batch in ("1", "2", "4", "8"):
        assert f'duplex_engine_step_seconds_count{{model="m",batch="{batch}"}} 0' in text
    assert 'batch="16"' not in text
    assert 'duplex_engine_tick_lateness_seconds_count{model="m"} 0' in text


class _Timed(WrappedLoopback):
    """The loopback whose step k takes 10 * (k + 1) ms on ``timer``; step 0 is warm-up."""

    def __init__(self, timer: FakeTimer) -> None:
        super().__init__(SPEC)
        self.timer = timer
        self.steps = 0

    def execute(self, plan: StepPlan) -> StepOutput:
        out = self.inner.execute(plan)
        self.steps += 1
        self.timer.now += 0.01 * self.steps
        return StepOutput(out.outputs, warmup=self.steps == 1)


def test_steps_recorded_under_their_batch_bucket_warm_up_left_out() -> None:
    timer = FakeTimer()
    recorder = EngineRecorder("m", max_slots=SPEC.max_slots)
    engine = Engine(_Timed(timer), timer=timer, recorder=recorder)
    handles = [engine.acquire_slot(f"s{i}") for i in range(3)]
    for k in range(4):
        for h in handles:
            assert h is not None
            engine.push_input(h, tone(1, k))
        engine.step(k * PERIOD)
    three = recorder.steps[2]  # 3 slots: the "4" bucket
    assert three.count == 3  # the first step was warm-up
    assert three.sum == pytest.approx(0.02 + 0.03 + 0.04)
    assert sum(cell.count for cell in recorder.steps) == 3


async def test_tick_lateness_of_a_tick_that_waited_for_an_overrun(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls = 0

    async def slow_first(sync_fn: Callable[[], T]) -> T:
        nonlocal calls
        calls += 1
        await trio.sleep(0.1 if calls == 1 else 0.0)  # tick 0 overruns into tick 1
        return sync_fn()

    recorder = EngineRecorder("loopback", max_slots=SPEC.max_slots)
    engine = Engine(LoopbackRunner(SPEC), recorder=recorder)
    driver = EngineDriver(engine, offload=slow_first, recorder=recorder)
    send, recv = trio.open_memory_channel[object](8)
    handle = driver.attach("a", send)
    assert handle is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        for k in range(3):
            driver.push_input(handle, tone(1, k))
            await recv.receive()
        nursery.cancel_scope.cancel()
    cell = recorder.lateness
    assert cell.count == 3
    # tick 0 on time; tick 1 (due at 0.08) started at 0.1; tick 2 on time again
    assert cell.sum == pytest.approx(0.1 - PERIOD, abs=1e-9)
    late_bucket = next(i for i, b in enumerate(TICK_LATENESS_BUCKETS) if b >= 0.1 - PERIOD)
    assert cell.counts[0] == 2 and cell.counts[late_bucket] == 1


def test_a_snapshot_exports_what_the_recorder_does_with_more_labels() -> None:
    """An engine process ships `snapshot` (plain data, pickled); the session process
    exports exactly the recorder's own samples, plus its ``engine`` label."""
    registry = MetricsRegistry()
    recorder = EngineRecorder("m", max_slots=5, registry=registry)
    for lateness in (0.0001, 0.003, 0.003, 2.0):
        recorder.tick(lateness)
    for batch, seconds in ((1, 0.004), (3, 0.05), (5, 0.07), (5, 3.0)):
        recorder.step(batch, seconds)
    snapshot = pickle.loads(pickle.dumps(recorder.snapshot()))
    for name, _ in ENGINE_HISTOGRAMS:
        (family,) = [f for f in registry.families() if f.name == name]
        shipped = list(snapshot.samples(name, {"model": "m", "engine": "0"}))
        assert [(s.name, {**s.labels, "engine": "0"}, s.value) for s in family.samples] == [
            (s.name, s.labels, s.value) for s in shipped
        ]
    recorder.step(2, 0.01)  # cumulative: a later snapshot has every observation so far
    counts = {
        s.labels["batch"]: s.value
        for s in recorder.snapshot().samples("duplex_engine_step_seconds", {"model": "m"})
        if s.name.endswith("_count")
    }
    assert counts == {"1": 1, "2": 1, "4": 1, "8": 2}
    with pytest.raises(ValueError, match="not an engine histogram"):
        list(snapshot.samples("duplex_output_delay_seconds", {}))
