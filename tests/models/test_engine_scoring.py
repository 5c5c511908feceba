"""The engine and driver for a scoring model (``steps_on_input``, ``outputs_audio=False``).

The silero VAD is such a model (tests/models/test_silero.py runs the real one);
here `CountingScorer`, a deterministic runner, shows what the engine does: a
step takes only the slots with a whole frame queued, a reset made while a slot
is idle reaches the runner before its next frame, positions keep gaps, and a
tick of the driver catches a backlog up by ``max_steps_per_tick`` frames.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import trio
import trio.testing

from duplex.exceptions import RunnerContractError
from duplex.models import (
    NO_AUDIO,
    Engine,
    EngineDriver,
    FrameOutput,
    ModelSpec,
    SlotOutput,
    StepOutput,
    StepPlan,
)
from duplex.models._driver import inline

N = 16
"""Samples per frame (1 ms at 16 kHz)."""
SPEC = ModelSpec(
    "scorer",
    sample_rate=16_000,
    frame_samples=N,
    max_slots=4,
    steps_on_input=True,
    max_steps_per_tick=3,
    outputs_audio=False,
)


class CountingScorer:
    """Score = frames this slot stepped since its last reset, plus the frame's first sample."""

    def __init__(self, spec: ModelSpec = SPEC) -> None:
        self.spec = spec
        self.counts = [0] * spec.max_slots
        self.resets: list[int] = []
        self.batches: list[tuple[int, ...]] = []

    def reset_slot(self, slot: int) -> None:
        self.counts[slot] = 0
        self.resets.append(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        self.batches.append(plan.live_slots)
        outputs = []
        for item in plan.inputs:
            assert item.frame is not None  # a scoring model never gets silence filler
            self.counts[item.slot] += 1
            score = self.counts[item.slot] + float(item.frame[0])
            outputs.append(FrameOutput(item.slot, NO_AUDIO, score=score))
        return StepOutput(tuple(outputs))


def frames(*values: float) -> np.ndarray:
    """Whole frames, frame k filled with ``values[k]``."""
    return np.repeat(np.array(values, dtype=np.float32), N)


def scores(outputs: dict[object, SlotOutput]) -> list[float | None]:
    return [out.frame.score for out in outputs.values()]


def test_only_slots_with_a_whole_frame_step() -> None:
    runner = CountingScorer()
    engine = Engine(runner)
    a, b = engine.acquire_slot("a"), engine.acquire_slot("b")
    assert a is not None and b is not None
    assert not engine.has_work()  # live, but nothing to score: an idle tick
    assert engine.step(0.0) == {}
    engine.push_input(b, np.zeros(N - 1, np.float32))
    assert not engine.has_work()  # a partial frame is not work
    engine.push_input(a, frames(0.5, 0.25))
    assert engine.has_work()
    (out,) = engine.step(0.0).values()
    assert out.handle == a and out.frame.score == 1.5 and out.position == 0
    assert out.pcm16 == b"" and out.frame.pcm.size == 0 and out.input_samples == N
    engine.push_input(b, np.zeros(1, np.float32))
    outs = engine.step(0.0)
    assert list(outs) == [a, b] and scores(outs) == [2.25, 1.0]
    assert outs[b].position == 0
    assert engine.step(0.0) == {} and not engine.has_work()
    stats = engine.statistics()
    assert stats.underruns == 0 and stats.ticks == 2  # steps that ran a forward
    assert runner.batches == [(a.slot,), (a.slot, b.slot)]


def test_a_reset_while_idle_reaches_the_runner_before_the_next_frame() -> None:
    runner = CountingScorer()
    engine = Engine(runner)
    h = engine.acquire_slot("a")
    assert h is not None
    engine.push_input(h, frames(0, 0))
    assert scores(engine.step(0.0)) == [1.0]
    engine.reset(h, 3)  # clears the queued frame; nothing to step now
    assert not engine.has_work() and engine.step(0.0) == {}
    engine.push_input(h, frames(0))
    (out,) = engine.step(0.0).values()
    assert out.frame.score == 1.0 and out.epoch == 3  # fresh state, new epoch
    assert out.position == 2 * N  # the cleared frame leaves a gap in the clock
    assert runner.resets == [h.slot, h.slot]  # acquired, then reset


def test_a_reset_keeping_input_steps_the_queued_frames_with_fresh_state() -> None:
    engine = Engine(CountingScorer())
    h = engine.acquire_slot("a")
    assert h is not None
    engine.push_input(h, frames(0, 0, 0))
    engine.step(0.0)
    engine.reset(h, 1, clear_input=False)
    outs = [engine.step(0.0)[h] for _ in range(2)]
    assert [(o.frame.score, o.epoch, o.position) for o in outs] == [(1.0, 1, N), (2.0, 1, 2 * N)]


def test_refused_frames_leave_a_gap_in_positions_and_are_counted() -> None:
    engine = Engine(CountingScorer(), max_input_frames=2)
    h = engine.acquire_slot("a")
    assert h is not None
    push = engine.push_input(h, frames(1, 2, 3, 4))
    assert (push.frames_queued, push.frames_rejected) == (2, 2) and push.overflowed
    got = []
    for _ in range(2):
        got.extend((o.position // N, o.frame.score) for o in engine.step(0.0).values())
    assert engine.push_input(h, frames(5)).frames_queued == 1  # room again
    got.extend((o.position // N, o.frame.score) for o in engine.step(0.0).values())
    assert got == [(0, 2.0), (1, 4.0), (4, 8.0)]  # frames 2 and 3 were refused
    assert engine.statistics().frames_rejected == engine.slot_statistics(h).frames_rejected == 2


def test_a_released_slot_is_reset_and_its_id_returns() -> None:
    runner = CountingScorer(dataclasses.replace(SPEC, max_slots=1))
    engine = Engine(runner)
    h = engine.acquire_slot("a")
    assert h is not None
    engine.push_input(h, frames(0))
    engine.step(0.0)
    assert engine.release_slot(h) and engine.acquire_slot("b") is None
    assert engine.has_work()  # the release awaits the runner
    assert engine.step(0.0) == {}
    again = engine.acquire_slot("b")
    assert again is not None and again.slot == h.slot and again != h
    engine.push_input(again, frames(0))
    assert scores(engine.step(0.0)) == [1.0]


class _Loud(CountingScorer):
    def execute(self, plan: StepPlan) -> StepOutput:
        out = super().execute(plan).outputs
        return StepOutput(tuple(dataclasses.replace(o, pcm=np.zeros(N, np.float32)) for o in out))


class _Mute(CountingScorer):
    def execute(self, plan: StepPlan) -> StepOutput:
        out = super().execute(plan).outputs
        return StepOutput(tuple(dataclasses.replace(o, score=None) for o in out))


@pytest.mark.parametrize("runner", [_Loud, _Mute])
def test_a_scoring_runner_must_return_a_score_and_no_audio(runner: type[CountingScorer]) -> None:
    engine = Engine(runner())
    h = engine.acquire_slot("a")
    assert h is not None
    engine.push_input(h, frames(0))
    with pytest.raises(RunnerContractError):
        engine.step(0.0)


def test_spec_rules_for_scoring_models() -> None:
    with pytest.raises(ValueError, match="needs steps_on_input"):
        ModelSpec("x", max_steps_per_tick=2)
    with pytest.raises(ValueError, match="one phase"):
        ModelSpec("x", steps_on_input=True, tick_phases=2)
    with pytest.raises(ValueError, match="max_steps_per_tick"):
        ModelSpec("x", steps_on_input=True, max_steps_per_tick=0)


async def test_a_tick_catches_a_backlog_up_in_bounded_steps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Eight frames queued at once: three steps a tick (the spec's bound), in order, and
    only ticks with input run; a steady slot beside it is scored once a step."""
    runner = CountingScorer()
    driver = EngineDriver(Engine(runner), offload=inline)
    send, recv = trio.open_memory_channel[SlotOutput](64)
    steady_send, steady_recv = trio.open_memory_channel[SlotOutput](64)
    burst = driver.attach("burst", send)
    steady = driver.attach("steady", steady_send)
    assert burst is not None and steady is not None
    period = SPEC.frame_period_s
    driver.push_input(burst, frames(*range(8)))
    driver.push_input(steady, frames(0, 0))
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        per_tick = []
        for k in range(5):
            await trio.sleep_until(start + (k + 0.5) * period)  # between ticks k and k + 1
            got = []
            while True:
                try:
                    got.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
            per_tick.append(len(got))
            assert all(o.tick >= 0 for o in got)
        nursery.cancel_scope.cancel()
    assert per_tick[:3] == [3, 3, 2] and sum(per_tick) == 8
    stats = driver.statistics()
    assert stats.idle_ticks >= 2 and stats.late_ticks == 0 and stats.dropped_full == 0
    assert stats.engine.underruns == 0
    steady_scores = [steady_recv.receive_nowait().frame.score for _ in range(2)]
    assert steady_scores == [1.0, 2.0]
    with pytest.raises(trio.WouldBlock):
        steady_recv.receive_nowait()
