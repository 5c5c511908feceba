from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import trio
import trio.testing

from duplex.exceptions import RunnerContractError
from duplex.models import (
    STALL_PERIODS,
    CapacityLimit,
    Engine,
    EngineDriver,
    LoopbackRunner,
    ModelSpec,
    Scheduler,
    SlotOutput,
    StepOutput,
    StepPlan,
)

from .models_support import FRAME, SPEC, FakeTimer, WrappedLoopback, loopback_engine, tone
from .test_engine import _Broken, _SlowRunner

PERIOD = SPEC.frame_period_s
T = TypeVar("T")


async def inline(sync_fn: Callable[[], T]) -> T:
    """Run the step on the trio thread, so MockClock cannot jump while it runs."""
    await trio.lowlevel.checkpoint()
    return sync_fn()


def _channel(size: int) -> tuple[trio.MemorySendChannel[SlotOutput], trio.MemoryReceiveChannel]:
    return trio.open_memory_channel[SlotOutput](size)


async def test_ticks_on_an_exact_grid_without_drift(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(loopback_engine(), offload=inline)
    send, recv = _channel(4)
    handle = driver.attach("a", send)
    assert handle is not None
    seen: list[tuple[float, SlotOutput]] = []
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        for k in range(200):
            driver.push_input(handle, tone(1, k))
            out = await recv.receive()
            seen.append((trio.current_time(), out))
        nursery.cancel_scope.cancel()
    for k, (received_at, out) in enumerate(seen):
        assert out.tick == k and out.position == k * FRAME and out.input_samples == FRAME
        assert out.at == received_at == pytest.approx(start + k * PERIOD, abs=1e-9)
    stats = driver.statistics()
    assert stats.late_ticks == 0 and stats.delivered == 200
    assert stats.engine.underruns == 0 and stats.engine.ticks == 200


async def test_idle_ticks_run_no_step(autojump_clock: trio.testing.MockClock) -> None:
    driver = EngineDriver(loopback_engine(), offload=inline)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD * 4.5)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert stats.ticks == stats.idle_ticks == 5 and stats.engine.ticks == 0


async def test_full_subscriber_drops_and_counts_without_blocking(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(loopback_engine(), offload=inline)
    slow_send, slow_recv = _channel(1)
    fast_send, fast_recv = _channel(16)
    slow = driver.attach("slow", slow_send)
    fast = driver.attach("fast", fast_send)
    assert slow is not None and fast is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD * 4.5)  # ticks 0..4 have run
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert (stats.delivered, stats.dropped_full) == (6, 4)
    assert slow_recv.receive_nowait().tick == 0
    assert [fast_recv.receive_nowait().tick for _ in range(5)] == [0, 1, 2, 3, 4]


async def test_attach_beyond_capacity_returns_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(loopback_engine(spec=ModelSpec("loopback", max_slots=2)), offload=inline)
    send, _recv = _channel(64)
    a, b = driver.attach("a", send.clone()), driver.attach("b", send.clone())
    assert a is not None and b is not None
    assert driver.attach("c", send.clone()) is None
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        assert driver.detach(a) and not driver.detach(a)
        assert driver.attach("c", send.clone()) is None  # the slot is freed by the next tick
        await trio.sleep(PERIOD)
        c = driver.attach("c", send.clone())
        assert c is not None and c.slot == a.slot
        nursery.cancel_scope.cancel()


async def test_closed_subscriber_is_detached(autojump_clock: trio.testing.MockClock) -> None:
    driver = EngineDriver(loopback_engine(), offload=inline)
    send, recv = _channel(4)
    assert driver.attach("a", send) is not None
    await recv.aclose()
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD * 2.5)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert stats.dropped_closed == 1 and stats.subscribers == 0
    assert stats.engine.live_slots == 0 and stats.engine.ticks == 1


async def test_late_ticks_counted_and_the_grid_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls = 0

    async def slow_first(sync_fn: Callable[[], T]) -> T:
        nonlocal calls
        calls += 1
        await trio.sleep(0.1 if calls == 1 else 0.0)  # tick 0 overruns into tick 1
        return sync_fn()

    driver = EngineDriver(loopback_engine(), offload=slow_first)
    send, recv = _channel(8)
    assert driver.attach("a", send) is not None
    got: list[tuple[float, float]] = []
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        for _ in range(4):
            out = await recv.receive()
            got.append((out.at - start, trio.current_time() - start))
        nursery.cancel_scope.cancel()
    assert got == [
        pytest.approx((0.0, 0.1)),
        pytest.approx((0.08, 0.1)),  # caught up at once, stamped with its grid time
        pytest.approx((0.16, 0.16)),
        pytest.approx((0.24, 0.24)),
    ]
    assert driver.statistics().late_ticks == 1


class _ThreadRecording:
    """Loopback that notes which thread executes each step."""

    def __init__(self) -> None:
        self.inner = LoopbackRunner(SPEC, delay_ms=80)
        self.threads: set[int] = set()

    @property
    def spec(self) -> ModelSpec:
        return SPEC

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        self.threads.add(threading.get_ident())
        return self.inner.execute(plan)


async def test_steps_run_on_a_worker_thread(autojump_clock: trio.testing.MockClock) -> None:
    runner = _ThreadRecording()
    driver = EngineDriver(Engine(runner))  # the default offload: trio.to_thread.run_sync
    send, recv = _channel(8)
    handle = driver.attach("a", send)
    assert handle is not None
    frames = [tone(3, k) for k in range(4)]
    for frame in frames:
        driver.push_input(handle, frame)
    outs = []
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        for _ in range(4):
            outs.append(await recv.receive())
        nursery.cancel_scope.cancel()
    assert runner.threads and threading.get_ident() not in runner.threads
    assert not outs[0].frame.pcm.any()
    for k in range(1, 4):
        np.testing.assert_array_equal(outs[k].frame.pcm, frames[k - 1])


async def test_engine_failure_propagates(autojump_clock: trio.testing.MockClock) -> None:
    driver = EngineDriver(Engine(_Broken()), offload=inline)
    send, _recv = _channel(1)
    assert driver.attach("a", send) is not None
    with pytest.RaisesGroup(RunnerContractError):
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.run)


async def test_dropped_outputs_carry_their_input_samples_forward(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(loopback_engine(), offload=inline)
    send, recv = _channel(1)
    handle = driver.attach("slow", send)
    assert handle is not None
    for k in range(5):
        driver.push_input(handle, tone(1, 10 * k))
        if k == 1:  # arrives with frame 1's audio, so tick 1 (dropped) consumes it
            driver.push_video(handle, "v1", 40, b"jpeg")
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD * 0.5)  # tick 0 delivered: the channel is now full
        await trio.sleep(PERIOD * 2)  # ticks 1..2 dropped
        first = recv.receive_nowait()
        await trio.sleep(PERIOD)  # tick 3 is delivered with the dropped ones' samples
        second = recv.receive_nowait()
        nursery.cancel_scope.cancel()
    assert driver.statistics().dropped_full == 2
    assert (first.input_samples, second.input_samples) == (FRAME, 3 * FRAME)
    assert second.frame.video_frame_ids == ("v1",) and second.frame.latest_video_pts_ms == 40


async def test_phase_groups_step_in_turn_on_a_sub_tick_grid(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``tick_phases=4``: slots join the smallest group; the grid is period / 4 and each
    sub-tick steps one group, so every slot still steps once per period, on its own
    offset, and echoes exactly what it would alone."""
    spec = ModelSpec(name="loopback", max_slots=8, tick_phases=4)
    driver = EngineDriver(loopback_engine(spec=spec, delay_ms=0), offload=inline)
    handles, channels = [], []
    for k in range(6):
        send, recv = _channel(8)
        handle = driver.attach(f"s{k}", send)
        assert handle is not None
        handles.append(handle)
        channels.append(recv)
    seen: list[list[SlotOutput]] = [[] for _ in handles]
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        for k in range(5):
            for index, handle in enumerate(handles):
                driver.push_input(handle, tone(index + 1, k))
            for index, recv in enumerate(channels):
                seen[index].append(await recv.receive())
        nursery.cancel_scope.cancel()
    # groups fill smallest first: 0, 1, 2, 3, 0, 1
    for index, outputs in enumerate(seen):
        phase = index % 4
        for k, out in enumerate(outputs):
            assert out.at == pytest.approx(start + (k * 4 + phase) * PERIOD / 4, abs=1e-9)
            assert out.position == k * FRAME and out.input_samples == FRAME
            np.testing.assert_array_equal(out.frame.pcm, tone(index + 1, k))
    assert driver.statistics().late_ticks == 0


async def test_phase_offsets_survive_idle_ticks(autojump_clock: trio.testing.MockClock) -> None:
    """A group's offset within the frame is a property of the grid: after the engine idles
    for a while (no slot, so no steps), a new slot in group 0 steps on group 0's offset."""
    spec = ModelSpec(name="loopback", max_slots=4, tick_phases=4)
    driver = EngineDriver(loopback_engine(spec=spec, delay_ms=0), offload=inline)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        for pause in (0.0, 0.03, 0.05):  # idle for 1.5 and 2.5 sub-ticks between sessions
            await trio.sleep(pause)
            send, recv = _channel(4)
            handle = driver.attach("a", send)
            assert handle is not None
            driver.push_input(handle, tone(1, 0))
            out = await recv.receive()
            assert driver.detach(handle)
            offset = (out.at - start) % PERIOD
            assert min(offset, PERIOD - offset) == pytest.approx(0.0, abs=1e-9)
        nursery.cancel_scope.cancel()


async def test_step_time_evidence_expires_while_the_engine_is_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two sessions ran over budget, so capacity fell to 1; both left and nothing ran.
    ``window_s`` later (trio's clock) the evidence is gone and batch 2 is probed again."""
    timer = FakeTimer()
    scheduler = Scheduler(SPEC.max_slots, PERIOD, window_s=10.0, min_samples=4)
    engine = Engine(_SlowRunner(timer, {1: 0.01, 2: 0.1}), scheduler, timer=timer)
    driver = EngineDriver(engine, offload=inline)
    send, _recv = _channel(64)
    a, b = driver.attach("a", send.clone()), driver.attach("b", send.clone())
    assert a is not None and b is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD * 8)
        report = driver.capacity()
        assert (report.slots, report.limit, report.over_batch) == (1, CapacityLimit.STEP_TIME, 2)
        assert driver.statistics().engine.scheduler.capacity == 1
        assert driver.attach("c", send.clone()) is None
        driver.detach(a)
        driver.detach(b)
        await trio.sleep(PERIOD * 2)
        assert driver.capacity().slots == 1  # idle, but the evidence is recent
        await trio.sleep(10.0)
        report = driver.capacity()
        assert (report.slots, report.limit) == (2, CapacityLimit.PROBE)
        assert driver.attach("d", send.clone()) is not None
        assert driver.attach("e", send.clone()) is not None
        assert driver.attach("f", send.clone()) is None
        nursery.cancel_scope.cancel()


class _Stuck(WrappedLoopback):
    """A step blocks while ``hold`` is set, as a hung kernel would."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.hold = threading.Event()
        self.released = threading.Event()

    def execute(self, plan: StepPlan) -> StepOutput:
        if self.hold.is_set():
            self.released.wait(timeout=30)
        return self.inner.execute(plan)


async def test_a_step_that_does_not_return_is_stalled_until_it_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runner = _Stuck(SPEC)
    driver = EngineDriver(Engine(runner), offload=trio.to_thread.run_sync)
    send, recv = _channel(64)
    handle = driver.attach("a", send)
    assert handle is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await recv.receive()
        assert not driver.stalled(trio.current_time())
        runner.hold.set()
        await trio.sleep(STALL_PERIODS * PERIOD / 2)  # late, not yet stalled
        assert not driver.stalled(trio.current_time())
        await trio.sleep(STALL_PERIODS * PERIOD)  # the clock jumps while the thread waits
        assert driver.stalled(trio.current_time())
        runner.hold.clear()
        runner.released.set()
        await recv.receive()
        assert not driver.stalled(trio.current_time())
        nursery.cancel_scope.cancel()
