"""The shared silero VAD: its runner on the engine, the driver, the segmenter on its windows.

The VAD is one more runner of the engine core (`silero_engine`: an `Engine` over a
`SileroRunner`, ticked by an `EngineDriver`); these tests drive it through that API.
Speech here is synthetic (espeak-ng is not guaranteed on test machines): a
voiced source-filter signal, `voiced` (``tests/signals.py``, shared with the
session and end-to-end tests), on which silero fires (> 0.5 on nearly every
window); silence and white noise stay under 0.1.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import socket
import sys
import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import torch
import trio
import trio.testing

from duplex.exceptions import SlotReleased
from duplex.models import (
    VAD_SAMPLE_RATE,
    VAD_WINDOW_MS,
    VAD_WINDOW_SAMPLES,
    Engine,
    EngineDriver,
    SileroRunner,
    SlotOutput,
    VadWindow,
    silero_engine,
    silero_spec,
    silero_weights_path,
)
from duplex.sessions import SegmentStarted, SegmentStopped, SpeechSegmenter

from ..signals import voiced

SR = VAD_SAMPLE_RATE
W = VAD_WINDOW_SAMPLES
T = TypeVar("T")

# -- signals ---------------------------------------------------------------


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), dtype=np.float32)


def noise(seconds: float, seed: int = 1, level: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (level * rng.standard_normal(int(seconds * SR))).astype(np.float32)


LONG = 10_000  # max_pending_ms for tests that push a whole clip at once


def scored(vad: Engine) -> list[VadWindow]:
    """Step until nothing is queued; every scored window, in order."""
    out: list[VadWindow] = []
    while batch := vad.step(0.0):
        out.extend(VadWindow.of(output) for output in batch.values())
    return out


def reference_probs(audio: np.ndarray) -> np.ndarray:
    """silero's own streaming model (its TorchScript module, its internal state)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load
        model = torch.jit.load(str(silero_weights_path())).eval()
    model.reset_states()
    with torch.no_grad():
        return np.array(
            [
                model(torch.from_numpy(audio[k * W : (k + 1) * W]).unsqueeze(0), SR).item()
                for k in range(len(audio) // W)
            ]
        )


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """1 s silence, 2 s voiced, 1 s silence, 1 s white noise."""
    return np.concatenate([silence(1.0), voiced(2.0), silence(1.0), noise(1.0)])


# -- the runner on the engine ----------------------------------------------


def test_weights_load_from_the_wheel_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    had_silero = "silero_vad" in sys.modules
    threads = torch.get_num_threads()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the VAD tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    vad = silero_engine(2)
    dist = importlib.metadata.distribution("silero-vad")
    assert silero_weights_path() == dist.locate_file("silero_vad/data/silero_vad.jit")
    assert vad.spec == silero_spec(2) and vad.spec.max_slots == 2
    assert torch.get_num_threads() == threads  # silero_vad's import side effect is avoided
    assert had_silero or "silero_vad" not in sys.modules


def test_spec_is_a_scoring_model_at_16_khz() -> None:
    spec = silero_spec(4)
    assert (spec.sample_rate, spec.frame_samples, spec.frame_ms) == (SR, W, VAD_WINDOW_MS)
    assert spec.steps_on_input and not spec.outputs_audio and spec.max_steps_per_tick == 8
    with pytest.raises(ValueError):
        SileroRunner(dataclasses.replace(spec, frame_samples=256))


def test_matches_silero_streaming_reference(speech: np.ndarray) -> None:
    vad = silero_engine(1, max_pending_ms=LONG)
    handle = vad.acquire_slot("a")
    assert handle is not None
    vad.push_input(handle, speech)
    windows = scored(vad)
    assert [w.start for w in windows] == [k * W for k in range(len(speech) // W)]
    ours = np.array([w.probability for w in windows])
    np.testing.assert_allclose(ours, reference_probs(speech), atol=1e-5)


def test_detects_voiced_speech_not_silence_or_noise(speech: np.ndarray) -> None:
    vad = silero_engine(1, max_pending_ms=LONG)
    handle = vad.acquire_slot("a")
    assert handle is not None
    vad.push_input(handle, speech)
    probs = np.array([w.probability for w in scored(vad)])
    per_s = SR // W  # 31.25 windows per second
    voiced_part = probs[int(1.0 * per_s) + 2 : int(3.0 * per_s) - 1]
    assert np.median(voiced_part) > 0.8 and np.mean(voiced_part > 0.5) > 0.9
    assert probs[: int(1.0 * per_s)].max() < 0.1  # leading silence
    assert probs[int(3.0 * per_s) + 4 : int(4.0 * per_s)].max() < 0.1  # trailing silence
    assert probs[int(4.0 * per_s) + 1 :].max() < 0.1  # white noise


def test_batched_steps_equal_each_stream_alone() -> None:
    """Streams join late, push uneven chunks and leave; each sees what it would see alone."""
    signals = [
        np.concatenate([silence(0.3), voiced(1.2, seed=i, f0=100 + 25 * i), noise(0.3, seed=i)])
        for i in range(5)
    ]
    alone = []
    for signal in signals:
        solo = silero_engine(1, max_pending_ms=LONG)
        h = solo.acquire_slot("solo")
        assert h is not None
        solo.push_input(h, signal)
        alone.append([w.probability for w in scored(solo)])

    vad = silero_engine(8, max_pending_ms=LONG)
    squatter = vad.acquire_slot("squatter")  # fills slot 0 with state, then leaves it to s3
    assert squatter is not None
    vad.push_input(squatter, voiced(0.5, seed=9))
    got: dict[int, list[float]] = {i: [] for i in range(5)}
    handles: dict[int, object] = {}
    offsets = [0] * 5
    batch_sizes = []
    for step in range(200):
        if step == 20:
            assert vad.release_slot(squatter)  # its id returns once a step reset it
        for i in range(5):
            if step == 3 * i and i != 3:
                handles[i] = vad.acquire_slot(f"s{i}")
            if step == 21 and i == 3:
                handles[i] = vad.acquire_slot("s3")
                assert handles[i].slot == squatter.slot  # type: ignore[attr-defined]
            if i in handles and offsets[i] < len(signals[i]):
                chunk = 300 + 170 * i  # uneven: windows complete on different steps
                vad.push_input(handles[i], signals[i][offsets[i] : offsets[i] + chunk])  # type: ignore[arg-type]
                offsets[i] += chunk
        batch = [VadWindow.of(output) for output in vad.step(float(step)).values()]
        batch_sizes.append(len(batch))
        owner = {h: i for i, h in handles.items()}
        for window in batch:
            if window.handle in owner:
                got[owner[window.handle]].append(window.probability)
    assert max(batch_sizes) >= 4  # windows really were batched
    for i in range(5):
        assert len(got[i]) == len(alone[i])
        np.testing.assert_allclose(got[i], alone[i], atol=1e-5)


def test_overflow_refuses_windows_and_keeps_the_clock() -> None:
    vad = silero_engine(1, max_pending_ms=3 * VAD_WINDOW_MS)
    handle = vad.acquire_slot("a")
    assert handle is not None
    push = vad.push_input(handle, noise(5 * W / SR + 0.001))
    assert (push.frames_queued, push.frames_rejected, push.queue_depth) == (3, 2, 3)
    assert push.overflowed and push.buffered_samples == 16
    assert vad.push_input(handle, noise((W - 16) / SR)).frames_rejected == 1  # still full
    windows = scored(vad)
    assert [w.start // W for w in windows] == [0, 1, 2]
    assert (windows[0].start_ms, windows[-1].end_ms) == (0, 96)
    vad.push_input(handle, noise(W / SR))
    (later,) = scored(vad)
    assert later.start == 6 * W and later.start_ms == 192  # refused windows: a gap, no shift
    stats = vad.slot_statistics(handle)
    assert (stats.frames_rejected, stats.peak_queue_depth, stats.max_input_frames) == (3, 3, 3)
    assert vad.statistics().frames_rejected == 3


def test_reset_gives_fresh_state_and_a_new_epoch() -> None:
    tail = voiced(0.6, seed=4)
    vad = silero_engine(2)
    used, fresh = vad.acquire_slot("used"), vad.acquire_slot("fresh")
    assert used is not None and fresh is not None
    vad.push_input(used, voiced(15 * W / SR, seed=3))
    scored(vad)
    vad.push_input(used, noise(3 * W / SR))  # queued, then cleared by the reset
    vad.reset(used, epoch=7)
    assert vad.slot_statistics(used).queue_depth == 0
    vad.push_input(used, tail[:100])  # uneven pushes: windows complete mid-chunk
    vad.push_input(fresh, tail[:100])
    vad.push_input(used, tail[100:])
    vad.push_input(fresh, tail[100:])
    windows = scored(vad)
    a = [w for w in windows if w.handle == used]
    b = [w for w in windows if w.handle == fresh]
    assert all(w.epoch == 7 for w in a) and all(w.epoch == 0 for w in b)
    assert a[0].start == (15 + 3) * W  # 15 scored, 3 cleared: the clock counts pushed audio
    np.testing.assert_allclose([w.probability for w in a], [w.probability for w in b], atol=1e-6)


def test_a_reset_drops_the_partial_window_unless_input_is_kept() -> None:
    """The clock counts the dropped samples; the session side pads to a window first
    (`VadLink.restart`), so its windows stay on the 32 ms grid."""
    vad = silero_engine(1)
    handle = vad.acquire_slot("a")
    assert handle is not None
    vad.push_input(handle, noise(2 * W / SR))
    vad.push_input(handle, silence(100 / SR))
    vad.reset(handle, 1)  # clears two windows and the partial one
    assert vad.push_input(handle, silence((W - 100) / SR)).frames_queued == 0
    assert vad.push_input(handle, silence(100 / SR)).frames_queued == 1
    assert [(w.start, w.epoch) for w in scored(vad)] == [(2 * W + 100, 1)]
    vad.push_input(handle, silence(100 / SR))
    vad.reset(handle, 2, clear_input=False)  # keeps the partial window
    assert vad.push_input(handle, silence((W - 100) / SR)).frames_queued == 1
    assert [(w.start, w.epoch) for w in scored(vad)] == [(3 * W + 100, 2)]


def test_pool_bounds_handles_and_input_checks() -> None:
    vad = silero_engine(2)
    a, b = vad.acquire_slot("a"), vad.acquire_slot("b")
    assert a is not None and b is not None and vad.acquire_slot("c") is None
    assert vad.release_slot(a) and not vad.release_slot(a)
    with pytest.raises(SlotReleased):
        vad.push_input(a, silence(0.1))
    with pytest.raises(SlotReleased):
        vad.reset(a, 1)
    assert vad.step(0.0) == {}  # the release reaches the runner; the id is free again
    c = vad.acquire_slot("c")
    assert c is not None and c.slot == a.slot and c != a
    with pytest.raises(TypeError):
        vad.push_input(c, np.zeros(W, dtype=np.float64))
    with pytest.raises(TypeError):
        vad.push_input(c, np.zeros((2, W), dtype=np.float32))
    assert not vad.has_work() and vad.step(0.0) == {}
    vad.push_input(c, silence(0.02))
    assert not vad.has_work()
    vad.push_input(c, silence(0.02))
    assert vad.has_work()
    with pytest.raises(ValueError):
        silero_engine(0)
    with pytest.raises(ValueError):
        silero_engine(1, max_pending_ms=10)


def test_statistics_count_steps_and_batches() -> None:
    clock = iter(np.arange(0.0, 100.0, 0.5))
    vad = silero_engine(4, timer=lambda: float(next(clock)))
    handles = [vad.acquire_slot(str(i)) for i in range(3)]
    for i, handle in enumerate(handles):
        assert handle is not None
        vad.push_input(handle, silence((i + 1) * W / SR))
    batches = [vad.step(float(k)) for k in range(4)]
    assert [len(b) for b in batches] == [3, 2, 1, 0]
    assert all(out.pcm16 == b"" and out.frame.score is not None for out in batches[0].values())
    stats = vad.statistics()
    assert (stats.live_slots, stats.ticks, stats.underruns) == (3, 3, 0)
    assert stats.scheduler.last_step_s == 0.5 and stats.scheduler.window_steps == 3


# -- the segmenter on the model ----------------------------------------------

WIN = VAD_WINDOW_MS


def test_segmenter_on_the_model_finds_the_voiced_turn(speech: np.ndarray) -> None:
    vad = silero_engine(1, max_pending_ms=LONG)
    handle = vad.acquire_slot("a")
    assert handle is not None
    vad.push_input(handle, speech)
    seg = SpeechSegmenter()
    events = [e for w in scored(vad) for e in seg.push(w.start_ms, w.end_ms, w.probability)]
    assert len(events) == 2
    started, stopped = events
    assert isinstance(started, SegmentStarted) and isinstance(stopped, SegmentStopped)
    assert abs(started.audio_start_ms - (1000 - 300)) <= 2 * WIN  # voice starts at 1.0 s
    assert abs(stopped.audio_end_ms - 3000) <= 3 * WIN  # and ends at 3.0 s
    assert stopped.detected_at_ms - stopped.audio_end_ms >= 500


# -- the driver --------------------------------------------------------------

PERIOD = W / SR


async def inline(sync_fn: Callable[[], T]) -> T:
    """Run steps on the trio thread, so MockClock cannot jump while one runs."""
    await trio.lowlevel.checkpoint()
    return sync_fn()


def _channel(size: int) -> tuple[trio.MemorySendChannel[SlotOutput], trio.MemoryReceiveChannel]:
    return trio.open_memory_channel[SlotOutput](size)


def _window(recv: trio.MemoryReceiveChannel[SlotOutput]) -> VadWindow:
    return VadWindow.of(recv.receive_nowait())


async def test_driver_ticks_on_a_grid_and_catches_up_in_bounded_steps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spec = dataclasses.replace(silero_spec(2), max_steps_per_tick=4)
    driver = EngineDriver(Engine(SileroRunner(spec)), offload=inline)
    send, recv = _channel(64)
    handle = driver.attach("a", send)
    assert handle is not None
    driver.push_input(handle, noise(10 * W / SR))
    seen: list[tuple[int, int]] = []
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        await trio.sleep(PERIOD * 4.5)  # ticks 0..4
        while True:
            try:
                window = _window(recv)
            except trio.WouldBlock:
                break
            seen.append((window.start, window.end_ms))
        nursery.cancel_scope.cancel()
    assert seen == [(k * W, (k + 1) * VAD_WINDOW_MS) for k in range(10)]
    stats = driver.statistics()
    assert (stats.ticks, stats.idle_ticks, stats.late_ticks) == (5, 2, 0)
    assert stats.engine.ticks == 10 and stats.delivered == 10
    assert trio.current_time() - start == pytest.approx(PERIOD * 4.5)


async def test_driver_delivers_each_window_one_tick_after_it_is_pushed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(silero_engine(2), offload=inline)
    send, recv = _channel(8)
    handle = driver.attach("a", send)
    assert handle is not None
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        for k in range(6):
            await trio.sleep_until(start + (k + 0.5) * PERIOD)  # half a window between ticks
            driver.push_input(handle, noise(W / SR, seed=k))
            window = VadWindow.of(await recv.receive())
            assert window.start == k * W
            assert trio.current_time() - start == pytest.approx((k + 1) * PERIOD)
        nursery.cancel_scope.cancel()


async def test_driver_full_subscriber_drops_without_blocking_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(silero_engine(2), offload=inline)
    slow_send, slow_recv = _channel(1)
    fast_send, fast_recv = _channel(16)
    slow, fast = driver.attach("slow", slow_send), driver.attach("fast", fast_send)
    assert slow is not None and fast is not None
    driver.push_input(slow, noise(3 * W / SR))
    driver.push_input(fast, noise(3 * W / SR))
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD / 2)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert (stats.delivered, stats.dropped_full) == (4, 2)
    assert _window(slow_recv).start == 0
    assert [_window(fast_recv).start for _ in range(3)] == [0, W, 2 * W]


async def test_driver_detaches_closed_subscribers_and_counts_orphans(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver: EngineDriver

    async def detach_mid_step(sync_fn: Callable[[], T]) -> T:
        result = sync_fn()
        driver.detach(leaving)  # while its windows are in flight
        return result

    driver = EngineDriver(silero_engine(3), offload=detach_mid_step)
    closed_send, closed_recv = _channel(4)
    leaving_send, _leaving_recv = _channel(4)
    closed = driver.attach("closed", closed_send)
    leaving = driver.attach("leaving", leaving_send)
    assert closed is not None and leaving is not None
    await closed_recv.aclose()
    driver.push_input(closed, noise(2 * W / SR))
    driver.push_input(leaving, noise(W / SR))
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(PERIOD / 2)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    assert (stats.dropped_closed, stats.orphaned, stats.subscribers) == (1, 2, 0)
    assert stats.engine.live_slots == 0


async def test_driver_counts_a_late_tick_and_keeps_the_grid(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A tick whose steps end after the next tick's time is late; the next runs at once,
    the windows keep their stream clock, and the loop is back on its grid after it."""
    calls = 0

    async def slow_first(sync_fn: Callable[[], T]) -> T:
        nonlocal calls
        calls += 1
        await trio.sleep(1.5 * PERIOD if calls == 1 else 0.0)  # tick 0 overruns tick 1
        return sync_fn()

    driver = EngineDriver(silero_engine(1), offload=slow_first)
    send, recv = _channel(8)
    handle = driver.attach("a", send)
    assert handle is not None
    got: list[tuple[int, float]] = []
    driver.push_input(handle, noise(W / SR))  # before the loop: tick 0 has it
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(driver.run)
        await trio.sleep(0.5 * PERIOD)
        driver.push_input(handle, noise(W / SR))  # lands while tick 0 is still running
        for _ in range(2):
            out = await recv.receive()
            got.append((out.position, trio.current_time() - start))
        await trio.sleep(PERIOD)  # idle ticks: on the grid again
        nursery.cancel_scope.cancel()
    assert got == [(0, pytest.approx(1.5 * PERIOD)), (W, pytest.approx(1.5 * PERIOD))]
    stats = driver.statistics()
    assert stats.late_ticks == 1 and stats.engine.ticks == 2


async def test_driver_steps_run_on_a_worker_thread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    threads: set[int] = set()

    def timer() -> float:  # the engine times each forward: note where it runs
        threads.add(threading.get_ident())
        return 0.0

    driver = EngineDriver(silero_engine(2, timer=timer))  # offload: trio.to_thread
    send, recv = _channel(8)
    handle = driver.attach("a", send)
    assert handle is not None
    driver.push_input(handle, noise(4 * W / SR))  # before the loop: time jumps while a step runs
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        starts = [VadWindow.of(await recv.receive()).start for _ in range(4)]
        nursery.cancel_scope.cancel()
    assert starts == [0, W, 2 * W, 3 * W]
    assert threads and threading.get_ident() not in threads


async def test_driver_and_segmenter_find_a_turn_in_streamed_audio(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = EngineDriver(silero_engine(2), offload=inline)
    send, recv = _channel(16)
    handle = driver.attach("a", send)
    assert handle is not None
    audio = np.concatenate([silence(0.5), voiced(1.0), silence(1.0)])
    seg = SpeechSegmenter()
    events: list[object] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        for k in range(0, len(audio), 1600):  # 100 ms chunks every 100 ms, as a client sends
            driver.push_input(handle, audio[k : k + 1600])
            await trio.sleep(0.1)
            while True:
                try:
                    w = _window(recv)
                except trio.WouldBlock:
                    break
                events.extend(seg.push(w.start_ms, w.end_ms, w.probability))
        nursery.cancel_scope.cancel()
    assert [type(e) for e in events] == [SegmentStarted, SegmentStopped]
    started, stopped = events
    assert isinstance(started, SegmentStarted) and isinstance(stopped, SegmentStopped)
    assert abs(started.audio_start_ms - 200) <= 2 * WIN
    assert abs(stopped.audio_end_ms - 1500) <= 3 * WIN
    stats = driver.statistics()
    assert stats.dropped_full == 0 and stats.engine.frames_rejected == 0 and stats.late_ticks == 0
