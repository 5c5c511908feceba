"""A session's stream on the shared silero VAD (`VadLink`): clocks, epochs, settings.

The link is synchronous; most tests drive it with a recording fake VAD and
hand-made windows. The last ones run the real VAD engine (`silero_engine` behind
an `EngineDriver`) under ``MockClock`` with the pure session machine, as the
session actor composes them.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import trio
import trio.testing

from duplex import sessions as ds
from duplex.exceptions import BadEvent
from duplex.models import (
    VAD_WINDOW_SAMPLES,
    EngineDriver,
    InputPush,
    SlotHandle,
    SlotOutput,
    VadWindow,
    silero_engine,
)
from duplex.models._driver import inline
from duplex.runtime._heard import Hearing
from duplex.runtime._vad_link import VadLink

from ..signals import voiced

RATE = 24_000
HANDLE = SlotHandle(0, "s", 1)
TURN_BASED = ds.SessionOptions(
    turn_policy="turn_based",
    turn_detection="server_vad",
    vad="silero",
    vad_threshold=0.5,
    vad_prefix_padding_ms=300,
    vad_hangover_ms=500,
    vad_create_response=True,
)


class FakeVad:
    """Records what a link pushes and resets."""

    def __init__(self) -> None:
        self.pushed = 0
        self.resets: list[tuple[int, bool]] = []
        self.detached = 0

    def push_input(self, handle: SlotHandle, pcm: np.ndarray) -> InputPush:
        assert pcm.dtype == np.float32
        self.pushed += pcm.size
        return InputPush(0, 0, self.pushed % VAD_WINDOW_SAMPLES, 0)

    def reset(self, handle: SlotHandle, epoch: int, *, clear_input: bool = True) -> None:
        self.resets.append((epoch, clear_input))

    def detach(self, handle: SlotHandle) -> bool:
        self.detached += 1
        return True


def config(**options: object) -> ds.SessionConfig:
    return ds.SessionConfig().updated(TURN_BASED).updated(ds.SessionOptions(**options))  # type: ignore[arg-type]


_HEARINGS: weakref.WeakKeyDictionary[VadLink, Hearing] = weakref.WeakKeyDictionary()


def push(link: VadLink, pcm: np.ndarray, start_ms: float) -> InputPush | None:
    """A model-rate chunk to ``link`` through its session's `Hearing`, as the actor does."""
    hearing = _HEARINGS.setdefault(link, Hearing(RATE))
    return link.push(hearing.push(pcm, start_ms))


def chunk(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, dtype=np.float32)


def window(handle: SlotHandle, epoch: int, index: int, probability: float) -> VadWindow:
    """Window ``index`` of a stream (it starts at sample ``512 index``)."""
    return VadWindow(handle, epoch, index * VAD_WINDOW_SAMPLES, probability)


def windows(link: VadLink, probs: list[float], first: int = 0) -> list[object]:
    out: list[object] = []
    for i, p in enumerate(probs):
        out.extend(link.on_window(window(link.handle, link.epoch, first + i, p)))
    return out


def test_windows_map_to_the_input_clock_from_the_first_chunk() -> None:
    fake = FakeVad()
    link = VadLink(fake, HANDLE, config())
    push(link, chunk(80), 1000.0)  # the stream opened when the input clock was at 1 s
    push(link, chunk(80), 1080.0)
    assert fake.pushed == 2 * 1280  # 24 kHz -> 16 kHz
    delay = (32 * 2 - 1) / 2 / 3 / 16  # the resampler's group delay, in ms
    events = windows(link, [0.1, 0.9, 0.9] + [0.1] * 16)
    started, stopped = events
    assert isinstance(started, ds.SpeechStarted) and isinstance(stopped, ds.SpeechStopped)
    assert started.audio_ms == pytest.approx(1000 + 32 - delay)  # unpadded: the machine pads
    assert stopped.audio_ms == pytest.approx(1000 + 96 - delay)  # after 500 ms of silence
    assert link.statistics().windows == 19


def test_stale_windows_are_dropped_and_counted() -> None:
    link = VadLink(FakeVad(), HANDLE, config())
    push(link, chunk(80), 0.0)
    other = SlotHandle(1, "t", 2)
    assert link.on_window(window(other, 0, 0, 1.0)) == ()
    assert link.on_window(window(HANDLE, 7, 0, 1.0)) == ()
    assert link.statistics().stale_windows == 2 and not link.segmenter.speaking


def test_restart_pads_to_a_window_and_starts_a_new_run() -> None:
    fake = FakeVad()
    link = VadLink(fake, HANDLE, config())
    push(link, chunk(100), 0.0)  # 1600 samples: 3 windows and 64 samples
    windows(link, [0.9])
    assert link.segmenter.speaking
    link.restart()  # input cleared
    assert fake.pushed == 4 * VAD_WINDOW_SAMPLES and fake.resets == [(1, True)]
    assert not link.segmenter.speaking and link.epoch == 1
    assert link.on_window(window(HANDLE, 0, 3, 0.9)) == ()  # the old epoch
    push(link, chunk(80), 100.0)
    (started,) = windows(link, [0.9], first=4)  # the run's first window
    assert isinstance(started, ds.SpeechStarted)
    assert started.audio_ms == 100.0  # the delay is clamped at the run's start


def test_turn_detection_off_pushes_nothing_and_back_on_restarts() -> None:
    fake = FakeVad()
    link = VadLink(fake, HANDLE, config())
    push(link, chunk(80), 0.0)
    link.reconfigure(config(turn_detection="none"))
    assert push(link, chunk(80), 80.0) is None and fake.pushed == 1280 + 256  # the pad only
    link.reconfigure(config(turn_detection="server_vad"))
    assert [epoch for epoch, _ in fake.resets] == [1, 2]
    push(link, chunk(80), 160.0)
    (started,) = windows(link, [0.9], first=3)
    assert isinstance(started, ds.SpeechStarted) and started.audio_ms == 160.0


def test_a_threshold_change_restarts_other_changes_do_not() -> None:
    fake = FakeVad()
    link = VadLink(fake, HANDLE, config())
    link.reconfigure(config(vad_create_response=False))
    assert fake.resets == []
    link.reconfigure(config(vad_threshold=0.8))
    assert link.segmenter.config.threshold == 0.8 and len(fake.resets) == 1


def test_replace_ends_speech_in_progress_at_the_last_window() -> None:
    link = VadLink(FakeVad(), HANDLE, config())
    push(link, chunk(160), 0.0)
    windows(link, [0.9, 0.9, 0.9])
    fresh = FakeVad()
    (stopped,) = link.replace(fresh, SlotHandle(0, "s", 9))
    assert isinstance(stopped, ds.SpeechStopped) and stopped.audio_ms == pytest.approx(96, abs=1)
    assert not link.segmenter.speaking and link.statistics().replacements == 1
    push(link, chunk(80), 160.0)
    assert fresh.pushed == 1280


def test_the_vad_is_fixed_for_the_session() -> None:
    m = ds.SessionMachine(config())
    m.handle(ds.ConnectionAttached(1), 0.0)
    out = m.handle(ds.SessionUpdate(ds.SessionOptions(vad="energy")), 0.0)
    (err,) = [e.event for e in out if isinstance(e, ds.Send)]
    assert isinstance(err, ds.ErrorEvent) and err.param == "session.vad"
    with pytest.raises(BadEvent):
        ds.SessionOptions(vad="external")


async def test_silero_turn_through_the_machine(autojump_clock: trio.testing.MockClock) -> None:
    """Speech 0.5-1.7 s in 80 ms appends: speech events near the truth, a turn, a response."""
    driver = EngineDriver(silero_engine(2), offload=inline)
    send, recv = trio.open_memory_channel[SlotOutput](32)
    handle = driver.attach("s", send)
    assert handle is not None
    machine = ds.SessionMachine(config())
    link = VadLink(driver, handle, machine.config)
    machine.handle(ds.ConnectionAttached(1), 0.0)
    audio = np.concatenate([chunk(500), voiced(1.2, seed=2, rate=RATE), chunk(1000)])
    sent: list[object] = []

    def apply(event: ds.Event) -> None:
        for effect in machine.handle(event, trio.current_time()):
            if isinstance(effect, ds.Send):
                sent.append(effect.event)
            elif isinstance(effect, ds.ModelAppendAudio):
                push(link, np.asarray(effect.pcm), effect.audio_start_ms)

    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        for k in range(0, audio.size, 1920):
            apply(ds.AudioAppend(audio[k : k + 1920]))
            await trio.sleep(0.08)
            while True:
                try:
                    output = recv.receive_nowait()
                except trio.WouldBlock:
                    break
                for event in link.on_window(VadWindow.of(output)):
                    apply(event)
        nursery.cancel_scope.cancel()
    (started,) = [e for e in sent if isinstance(e, ds.InputSpeechStarted)]
    (stopped,) = [e for e in sent if isinstance(e, ds.InputSpeechStopped)]
    assert abs(started.audio_start_ms - (500 - 300)) <= 64  # padded by the machine
    assert abs(stopped.audio_end_ms - 1700) <= 96
    assert any(isinstance(e, ds.InputAudioCommitted) for e in sent)
    assert any(isinstance(e, ds.ResponseCreated) for e in sent)
    assert link.statistics().stale_windows == 0 and driver.statistics().dropped_full == 0


def test_a_stream_that_falls_behind_is_refused_counted_and_keeps_its_clock() -> None:
    """On the real VAD engine: a burst past the stream's queue is refused (the link counts
    it), and the windows after the gap still map to the input time they were spoken at."""
    engine = silero_engine(1, max_pending_ms=4 * 32)
    handle = engine.acquire_slot("s")
    assert handle is not None
    link = VadLink(engine, handle, config(vad_hangover_ms=100))
    burst = push(link, chunk(400), 0.0)  # 12.5 windows at once: 4 fit
    assert burst is not None and burst.overflowed
    assert link.statistics().overflow_windows == burst.frames_rejected == 8
    starts = []
    while outputs := engine.step(0.0):
        starts.extend(VadWindow.of(o).start for o in outputs.values())
    assert starts == [k * VAD_WINDOW_SAMPLES for k in range(4)]
    speech = voiced(0.4, seed=2, rate=RATE)
    events: list[object] = []
    for k in range(0, speech.size, 1920):  # in real time again: 80 ms chunks, all scored
        pushed = push(link, speech[k : k + 1920], 400.0 + k / 24)
        assert pushed is not None and not pushed.overflowed
        while outputs := engine.step(0.0):
            for output in outputs.values():
                events.extend(link.on_window(VadWindow.of(output)))
    (started,) = [e for e in events if isinstance(e, ds.SpeechStarted)]
    assert 400 <= started.audio_ms <= 400 + 96  # after the gap, on the input clock
    assert link.statistics().stale_windows == 0 and link.statistics().overflow_windows == 8


def test_pauses_and_resumptions_map_to_the_machine_with_vad_prepare_ms() -> None:
    link = VadLink(FakeVad(), HANDLE, config(vad_prepare_ms=200))
    push(link, chunk(80), 1000.0)
    delay = (32 * 2 - 1) / 2 / 3 / 16
    events = windows(link, [0.9, 0.9] + [0.1] * 7 + [0.9] + [0.1] * 16)
    kinds = [type(e) for e in events]
    assert kinds == [
        ds.SpeechStarted, ds.SpeechPaused, ds.SpeechResumed, ds.SpeechPaused, ds.SpeechStopped
    ]  # fmt: skip
    at = [1000 + ms - delay for ms in (64, 9 * 32, 10 * 32, 10 * 32)]
    assert [e.audio_ms for e in events[1:]] == pytest.approx(at)  # type: ignore[attr-defined]
    quiet = VadLink(FakeVad(), HANDLE, config())  # off by default
    push(quiet, chunk(80), 0.0)
    assert [type(e) for e in windows(quiet, [0.9] + [0.1] * 10)] == [ds.SpeechStarted]
