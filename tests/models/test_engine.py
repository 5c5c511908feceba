from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.exceptions import RunnerContractError, SlotReleased, VideoInputUnsupported
from duplex.models import (
    Engine,
    FrameOutput,
    LoopbackRunner,
    ModelSpec,
    Scheduler,
    SlotHandle,
    StepOutput,
    StepPlan,
)
from duplex.pcm import float_to_pcm16

from .models_support import FRAME, SPEC, FakeTimer, loopback_engine, tone


def test_step_returns_early_when_nothing_is_live() -> None:
    engine = loopback_engine()
    assert not engine.has_work()
    assert engine.step(0.0) == {}
    assert engine.statistics().ticks == 0


def test_push_frames_arbitrary_chunks() -> None:
    engine = loopback_engine(delay_ms=0)
    h = engine.acquire_slot("a")
    assert h is not None
    stream = np.concatenate([tone(1, k) for k in range(3)])
    pushes = [engine.push_input(h, chunk) for chunk in np.split(stream, [100, 2500, 2501, 5000])]
    assert [p.frames_queued for p in pushes] == [0, 1, 0, 1, 1]
    assert pushes[-1].buffered_samples == 0 and pushes[-1].queue_depth == 3
    for k in range(3):
        (out,) = engine.step(float(k)).values()
        np.testing.assert_array_equal(out.frame.pcm, tone(1, k))
        assert out.input_samples == FRAME and out.position == k * FRAME
        assert out.pcm16 == float_to_pcm16(tone(1, k)).astype("<i2").tobytes()


def test_push_rejects_non_float32() -> None:
    engine = loopback_engine()
    h = engine.acquire_slot("a")
    assert h is not None
    with pytest.raises(TypeError):
        engine.push_input(h, np.zeros(FRAME))
    with pytest.raises(TypeError):
        engine.push_input(h, np.zeros((2, FRAME), np.float32))


def test_input_overflow_is_reported_and_counted() -> None:
    engine = loopback_engine(max_input_frames=2)
    h = engine.acquire_slot("a")
    assert h is not None
    push = engine.push_input(h, np.zeros(3 * FRAME + 10, np.float32))
    assert (push.frames_queued, push.frames_rejected, push.buffered_samples) == (2, 1, 10)
    assert push.overflowed
    assert engine.slot_statistics(h).frames_rejected == 1
    assert engine.statistics().frames_rejected == 1
    assert engine.slot_statistics(h).peak_queue_depth == 2


def test_underruns_counted_per_slot_and_in_total() -> None:
    engine = loopback_engine()
    a, b = engine.acquire_slot("a"), engine.acquire_slot("b")
    assert a is not None and b is not None
    for k in range(4):
        if k % 2 == 0:
            engine.push_input(a, tone(0, k))
        outs = engine.step(float(k))
        assert outs[b].input_samples == 0
        assert outs[a].input_samples == (FRAME if k % 2 == 0 else 0)
    stats = engine.statistics()
    assert stats.underruns == 6 and dict(stats.slot_underruns) == {a.slot: 2, b.slot: 4}
    assert stats.ticks == 4


def test_slot_span_is_the_highest_live_slot_plus_one() -> None:
    """What a static-shape step runs: one session left on a high slot keeps it wide."""
    engine = loopback_engine()
    assert engine.statistics().slot_span == 0
    handles = [engine.acquire_slot(name) for name in "abc"]
    assert [h.slot for h in handles if h is not None] == [0, 1, 2]
    assert engine.statistics().slot_span == 3
    engine.release_slot(handles[1])
    assert engine.statistics().slot_span == 3  # c still holds slot 2
    engine.release_slot(handles[2])
    assert engine.statistics().slot_span == 1
    engine.step(0.0)  # the runner drops the released slots' state: their ids are free
    again = engine.acquire_slot("d")
    assert again is not None and again.slot == 1  # the lowest free slot first
    assert engine.statistics().slot_span == 2


@dataclass
class Session:
    name: str
    join: int
    leave: int
    seed: int

    def frames_at(self, k: int) -> list[np.ndarray]:
        """Input pushed at absolute tick k: gaps (underruns) and a double push."""
        rel = k - self.join
        if rel % 7 == 4:
            return []
        return [tone(self.seed, rel)] * (2 if rel == 2 else 1)


def _scenario(sessions: list[Session], ticks: int) -> dict[str, list[tuple]]:
    engine = loopback_engine()
    handles: dict[str, SlotHandle] = {}
    seen: dict[str, list[tuple]] = {s.name: [] for s in sessions}
    for k in range(ticks):
        for s in sessions:
            if k == s.leave:
                assert engine.release_slot(handles.pop(s.name))
            if k == s.join:
                h = engine.acquire_slot(s.name)
                assert h is not None
                handles[s.name] = h
            if s.name in handles:
                for frame in s.frames_at(k):
                    engine.push_input(handles[s.name], frame)
        outs = engine.step(float(k))
        assert set(outs) == set(handles.values())
        for name, h in handles.items():
            o = outs[h]
            f = o.frame
            audio = (o.epoch, o.position, o.input_samples, f.pcm.tobytes())
            seen[name].append((*audio, f.text, f.speaking, f.end_of_turn))
    return seen


def test_slots_joining_and_leaving_match_running_alone() -> None:
    sessions = [
        Session("a", 0, 30, 1),
        Session("b", 3, 12, 2),
        Session("c", 5, 26, 3),
        Session("d", 13, 30, 4),  # reuses b's slot id once it is free
        Session("e", 12, 20, 5),
    ]
    together = _scenario(sessions, 30)
    for s in sessions:
        alone = _scenario([s], 30)[s.name]
        assert together[s.name] == alone, s.name
        assert len(alone) == s.leave - s.join


def test_released_slot_id_returns_only_after_a_step() -> None:
    engine = loopback_engine(spec=ModelSpec(name="loopback", max_slots=2))
    a, b = engine.acquire_slot("a"), engine.acquire_slot("b")
    assert a is not None and b is not None
    engine.step(0.0)
    assert engine.release_slot(a) and not engine.release_slot(a)
    assert engine.acquire_slot("c") is None
    assert set(engine.step(1.0)) == {b}
    c = engine.acquire_slot("c")
    assert c is not None and c.slot == a.slot and c != a


def test_stale_handle_raises() -> None:
    engine = loopback_engine()
    a = engine.acquire_slot("a")
    assert a is not None
    engine.release_slot(a)
    engine.step(0.0)
    with pytest.raises(SlotReleased):
        engine.push_input(a, tone(0, 0))
    with pytest.raises(SlotReleased):
        engine.reset(a, 1)


def test_reset_clears_only_that_slot_and_stamps_epoch() -> None:
    engine = loopback_engine()
    a, b = engine.acquire_slot("a"), engine.acquire_slot("b")
    assert a is not None and b is not None
    out_a, out_b = [], []
    for k in range(10):
        if k == 5:
            engine.push_input(a, tone(9, 99))  # queued, then cleared by the reset
            engine.reset(a, epoch=1)
            assert engine.slot_statistics(a).queue_depth == 0
        engine.push_input(a, tone(1, 10 * k))  # 10 * k: always a speech frame
        engine.push_input(b, tone(2, k))
        outs = engine.step(float(k))
        out_a.append(outs[a])
        out_b.append(outs[b])
    assert [o.epoch for o in out_a] == [0] * 5 + [1] * 5
    assert all(o.epoch == 0 for o in out_b)
    for k in range(10):
        np.testing.assert_array_equal(out_b[k].frame.pcm, tone(2, k - 3) if k >= 3 else 0)
    # after the reset a's delay line restarts: 3 frames of silence, then input from tick 5
    assert all(not o.frame.pcm.any() for o in out_a[5:8])
    np.testing.assert_array_equal(out_a[8].frame.pcm, tone(1, 50))
    assert out_a[8].frame.text == f"[{5 * 80}]"  # the audio clock keeps running


def test_video_is_drained_each_tick_and_bounded() -> None:
    engine = loopback_engine(max_video_frames=2)
    h = engine.acquire_slot("a")
    assert h is not None
    assert [engine.push_video(h, f"f{i}", i * 40, b"img") for i in range(3)] == [0, 0, 1]
    (out,) = engine.step(0.0).values()
    assert out.frame.video_frame_ids == ("f1", "f2")
    assert out.frame.latest_video_pts_ms == 80
    (out,) = engine.step(1.0).values()
    assert out.frame.video_frame_ids == ()
    assert engine.statistics().video_dropped == 1


def test_video_reaches_the_model_with_the_audio_it_arrived_with() -> None:
    engine = loopback_engine(delay_ms=0)
    h = engine.acquire_slot("a")
    assert h is not None
    engine.push_input(h, tone(1, 0))
    engine.push_input(h, tone(1, 1)[: FRAME // 2])
    engine.push_video(h, "mid1", 120, b"img")  # halfway through audio frame 1
    engine.push_input(h, tone(1, 1)[FRAME // 2 :])
    engine.push_input(h, tone(1, 2))
    engine.push_video(h, "after2", 240, b"img")
    ticks = [engine.step(float(k))[h].frame.video_frame_ids for k in range(4)]
    assert ticks[:3] == [(), ("mid1",), ("after2",)]
    assert ticks[3] == ()
    engine.push_video(h, "alone", 400, b"img")  # no audio to wait for: the next tick
    assert engine.step(4.0)[h].frame.video_frame_ids == ("alone",)


def test_video_refused_by_audio_only_models() -> None:
    engine = Engine(LoopbackRunner(ModelSpec(name="audio-only")))
    h = engine.acquire_slot("a")
    assert h is not None
    with pytest.raises(VideoInputUnsupported):
        engine.push_video(h, "f", 0, b"")


class _Interfering:
    """A runner that lets a test act on the engine while a step executes."""

    def __init__(self, inner: LoopbackRunner, during: list) -> None:
        self.inner = inner
        self.during = during
        self.plans: list[StepPlan] = []
        self.resets: list[int] = []

    @property
    def spec(self) -> ModelSpec:
        return self.inner.spec

    def reset_slot(self, slot: int) -> None:
        self.resets.append(slot)
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        self.plans.append(plan)
        while self.during:
            self.during.pop(0)()
        return self.inner.execute(plan)


def test_commands_during_a_step_apply_at_the_next_one() -> None:
    during: list = []
    runner = _Interfering(LoopbackRunner(SPEC), during)
    engine = Engine(runner)
    a, b = engine.acquire_slot("a"), engine.acquire_slot("b")
    assert a is not None and b is not None
    engine.step(0.0)
    assert runner.plans[0].new_slots == (0, 1) and runner.resets == [0, 1]
    during.extend([lambda: engine.reset(a, 7), lambda: engine.release_slot(b)])
    outs = engine.step(1.0)
    assert outs[a].epoch == 0 and set(outs) == {a, b}  # the step in flight is not disturbed
    engine.step(2.0)
    plan = runner.plans[2]
    assert (plan.new_slots, plan.continuing_slots, plan.released_slots) == ((), (0,), (1,))
    assert runner.resets == [0, 1, 1, 0]


def test_released_slot_is_reset_even_when_nothing_is_live() -> None:
    runner = _Interfering(LoopbackRunner(SPEC), [])
    engine = Engine(runner)
    a = engine.acquire_slot("a")
    assert a is not None
    engine.step(0.0)
    engine.release_slot(a)
    assert engine.has_work()
    assert engine.step(1.0) == {}
    assert runner.resets == [0, 0] and not engine.has_work()
    assert engine.statistics().scheduler.free == SPEC.max_slots


class _Broken:
    spec = SPEC

    def reset_slot(self, slot: int) -> None:
        pass

    def execute(self, plan: StepPlan) -> StepOutput:
        return StepOutput((FrameOutput(plan.live_slots[0], np.zeros(10, np.float32)),))


def test_runner_contract_violation_raises() -> None:
    engine = Engine(_Broken())
    assert engine.acquire_slot("a") is not None
    with pytest.raises(RunnerContractError):
        engine.step(0.0)


class _SlowRunner:
    """Advances a fake timer by a per-batch cost on each step."""

    def __init__(self, timer: FakeTimer, cost: dict[int, float]) -> None:
        self.inner = LoopbackRunner(SPEC)
        self.timer = timer
        self.cost = cost

    @property
    def spec(self) -> ModelSpec:
        return SPEC

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        self.timer.now += self.cost[len(plan.inputs)]
        return self.inner.execute(plan)


def test_admission_follows_measured_step_time() -> None:
    timer = FakeTimer()
    cost = {1: 0.01, 2: 0.02, 3: 0.07}  # 3 slots exceed 0.8 * 80 ms = 64 ms
    scheduler = Scheduler(SPEC.max_slots, SPEC.frame_period_s, min_samples=4)
    engine = Engine(_SlowRunner(timer, cost), scheduler, timer=timer)
    handles = [engine.acquire_slot(n) for n in "abc"]
    assert all(handles)
    for k in range(4):
        engine.step(float(k))
    stats = engine.statistics()
    assert stats.scheduler.capacity == 2 and stats.scheduler.p99_step_s == pytest.approx(0.07)
    assert stats.overrun_steps == 0
    assert engine.acquire_slot("d") is None
    engine.release_slot(handles[2])
    engine.step(4.0)
    assert engine.acquire_slot("d") is None  # two live: at capacity


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(0, 4 * FRAME), max_size=12))
def test_framing_is_independent_of_chunking(cuts: list[int]) -> None:
    engine = loopback_engine(delay_ms=0)
    h = engine.acquire_slot("a")
    assert h is not None
    stream = np.concatenate([tone(7, 10 * k) for k in range(4)])
    pushes = [engine.push_input(h, chunk) for chunk in np.split(stream, sorted(cuts))]
    assert sum(p.frames_queued for p in pushes) == 4
    assert not any(p.overflowed for p in pushes)
    got = [next(iter(engine.step(float(k)).values())).frame.pcm for k in range(4)]
    np.testing.assert_array_equal(np.concatenate(got), stream)


def test_commands_from_another_thread_never_race_a_step() -> None:
    """Trio-side calls interleaved with steps on a worker thread keep the pool consistent."""
    engine = loopback_engine(spec=ModelSpec(name="loopback", max_slots=4))
    stop = threading.Event()
    errors: list[BaseException] = []

    def stepper() -> None:
        k = 0
        while not stop.is_set():
            try:
                engine.step(float(k))
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)
                return
            k += 1

    worker = threading.Thread(target=stepper)
    worker.start()
    rng = np.random.default_rng(0)
    handles: list[SlotHandle] = []
    try:
        for i in range(3000):
            action = rng.integers(4)
            if action == 0:
                h = engine.acquire_slot(f"s{i}")
                if h is not None:
                    handles.append(h)
            elif handles and action == 1:
                engine.release_slot(handles.pop(int(rng.integers(len(handles)))))
            elif handles and action == 2:
                engine.reset(handles[0], i)
            elif handles:
                engine.push_input(handles[-1], tone(1, i)[: int(rng.integers(1, FRAME))])
    finally:
        stop.set()
        worker.join()
    if errors:
        raise errors[0]
    for h in handles:
        engine.release_slot(h)
    engine.step(0.0)
    stats = engine.statistics().scheduler
    assert (stats.live, stats.releasing, stats.free) == (0, 0, 4)


def test_reset_can_keep_queued_input() -> None:
    engine = loopback_engine()
    a = engine.acquire_slot("a")
    assert a is not None
    for k in range(3):
        engine.push_input(a, tone(1, 10 * k))
    engine.reset(a, epoch=1, clear_input=False)  # a barge-in keeps what the user said
    assert engine.slot_statistics(a).queue_depth == 3
    outs = [engine.step(float(k))[a] for k in range(3)]
    assert [o.epoch for o in outs] == [1, 1, 1]
    assert [o.input_samples for o in outs] == [FRAME] * 3


def _voiced(k: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(k).standard_normal(FRAME)).astype(np.float32)


def test_a_late_frame_adds_one_frame_of_lag_repaid_in_the_next_silence() -> None:
    engine = loopback_engine(delay_ms=0)
    h = engine.acquire_slot("a")
    assert h is not None
    stream = [_voiced(k) for k in range(6)] + [np.zeros(FRAME, np.float32)] * 4
    engine.push_input(h, stream[0])
    assert engine.step(0.0)[h].input_samples == FRAME
    assert engine.step(1.0)[h].input_samples == 0  # frame 1 is late: an underrun
    assert engine.slot_statistics(h).lag_frames == 1
    engine.push_input(h, stream[1])  # it arrives after its tick, with no way to catch up
    heard = []
    for k in range(2, len(stream)):
        engine.push_input(h, stream[k])
        out = engine.step(float(k))[h]
        heard.append((out.input_samples // FRAME, engine.slot_statistics(h).queue_depth))
    # speech is never skipped: one frame waits behind each tick until the first silence
    assert heard[:5] == [(1, 1)] * 5
    assert heard[5] == (2, 0) and heard[6:] == [(1, 0)] * 2  # the silent frame 6 was skipped
    stats = engine.slot_statistics(h)
    assert (stats.lag_frames, stats.silence_skipped, stats.underruns) == (0, 1, 1)
    assert engine.statistics().silence_skipped == 1


def test_a_pause_longer_than_max_lag_owes_nothing() -> None:
    engine = loopback_engine(delay_ms=0, max_lag_frames=2)
    h = engine.acquire_slot("a")
    assert h is not None
    for k in range(2):
        engine.step(float(k))
    assert engine.slot_statistics(h).lag_frames == 2
    engine.step(2.0)  # a third missing frame: the client paused
    assert engine.slot_statistics(h).lag_frames == 0
    engine.push_input(h, np.zeros(3 * FRAME, np.float32))  # then sends a burst of silence
    assert [engine.step(3.0 + k)[h].input_samples for k in range(3)] == [FRAME] * 3
    assert engine.statistics().silence_skipped == 0


def test_clearing_input_forgives_the_lag() -> None:
    engine = loopback_engine(delay_ms=0)
    h = engine.acquire_slot("a")
    assert h is not None
    engine.step(0.0)
    assert engine.slot_statistics(h).lag_frames == 1
    engine.reset(h, 1)
    engine.push_input(h, np.zeros(2 * FRAME, np.float32))
    assert [engine.step(1.0 + k)[h].input_samples for k in range(2)] == [FRAME] * 2


def test_phase_groups_are_filled_smallest_first_and_stepped_alone() -> None:
    """``tick_phases=3``: newcomers join the smallest group; ``step(now, phase)`` steps only
    that group's slots; a release queued meanwhile is applied by whichever step comes next."""
    spec = ModelSpec(name="loopback", max_slots=8, tick_phases=3)
    eng = loopback_engine(spec=spec, delay_ms=0)
    handles = [eng.acquire_slot(f"s{k}") for k in range(5)]
    assert all(h is not None for h in handles)
    for k, handle in enumerate(handles):
        assert handle is not None
        eng.push_input(handle, tone(k + 1, 0))
    groups = {phase: set(eng.step(0.0, phase)) for phase in range(3)}
    assert groups == {0: {handles[0], handles[3]}, 1: {handles[1], handles[4]}, 2: {handles[2]}}
    assert handles[2] is not None and eng.release_slot(handles[2])
    assert eng.step(0.1, 0).keys() == {handles[0], handles[3]}  # frees slot 2's id too
    newcomer = eng.acquire_slot("late")  # group 2 is now the smallest
    assert newcomer is not None and newcomer.slot == 2
    eng.push_input(newcomer, tone(9, 0))
    assert set(eng.step(0.2, 2)) == {newcomer}


class _WarmupRunner:
    """Loopback whose first step costs 2.06 s and is flagged warm-up (a graph capture)."""

    def __init__(self, timer: FakeTimer, flag: bool = True) -> None:
        self.inner = LoopbackRunner(SPEC)
        self.timer = timer
        self.flag = flag
        self.steps = 0

    @property
    def spec(self) -> ModelSpec:
        return SPEC

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        first = self.steps == 0
        self.steps += 1
        self.timer.now += 2.06 if first else 0.01
        out = self.inner.execute(plan)
        return StepOutput(out.outputs, warmup=True) if first and self.flag else out


def test_warmup_steps_stay_out_of_the_window() -> None:
    timer = FakeTimer()
    scheduler = Scheduler(SPEC.max_slots, SPEC.frame_period_s, min_samples=1, min_slow=1)
    engine = Engine(_WarmupRunner(timer), scheduler, timer=timer)
    handle = engine.acquire_slot("a", now=0.0)
    assert handle is not None
    for k in range(20):
        engine.step(k * SPEC.frame_period_s)
    stats = engine.statistics()
    assert stats.warmup_steps == 1 and stats.scheduler.window_steps == 19
    assert stats.scheduler.max_step_s == pytest.approx(0.01)
    assert engine.capacity().slots == SPEC.max_slots


def test_one_unflagged_slow_first_step_does_not_lock_the_engine() -> None:
    """The issue's GPU case through the engine: a 2.06 s first step the runner did not
    flag, then a closed session; eight newcomers at once are all admitted."""
    timer = FakeTimer()
    engine = Engine(_WarmupRunner(timer, flag=False), timer=timer)
    handle = engine.acquire_slot("first", now=0.0)
    assert handle is not None
    for k in range(40):
        engine.step(k * SPEC.frame_period_s)
    engine.release_slot(handle)
    engine.step(40 * SPEC.frame_period_s)
    handles = [engine.acquire_slot(f"s{i}", now=4.0) for i in range(8)]
    assert all(h is not None for h in handles)
