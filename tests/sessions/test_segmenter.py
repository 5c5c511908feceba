"""The server_vad segmenter (`SpeechSegmenter`): pure, windows of probabilities in, events out.

The silero VAD's windows (``tests/models/test_silero.py`` runs it on the model) and the
energy VAD's frames (``test_resample_vad.py``) both go through it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.sessions import (
    IdleTimeout,
    SegmentPaused,
    SegmentResumed,
    SegmentStarted,
    SegmentStopped,
    ServerVadConfig,
    SpeechSegmenter,
)

WIN = 32
"""The silero VAD's window (ms)."""


def feed(seg: SpeechSegmenter, probs: list[float], first: int = 0) -> list[object]:
    """Push windows ``first, first + 1, ...``; returns all events in order."""
    events: list[object] = []
    for k, p in enumerate(probs, start=first):
        events.extend(seg.push(k * WIN, (k + 1) * WIN, p))
    return events


def test_speech_starts_at_threshold_with_prefix_padding() -> None:
    seg = SpeechSegmenter(ServerVadConfig(threshold=0.5, prefix_padding_ms=300))
    assert feed(seg, [0.49] * 20) == []
    assert not seg.speaking
    assert feed(seg, [0.5], first=20) == [SegmentStarted(20 * WIN - 300, 21 * WIN)]
    assert seg.speaking
    assert feed(seg, [0.9] * 5, first=21) == []  # no second start while speaking


def test_prefix_padding_clamps_at_zero() -> None:
    seg = SpeechSegmenter(ServerVadConfig(prefix_padding_ms=300))
    assert feed(seg, [0.1, 0.1, 0.8]) == [SegmentStarted(0, 3 * WIN)]


def test_speech_stops_after_the_silence_duration() -> None:
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=5 * WIN))
    events = feed(seg, [0.9] * 10 + [0.1] * 4)
    assert events == [SegmentStarted(0, WIN)] and seg.speaking  # 4 windows: not yet
    assert feed(seg, [0.1], first=14) == [SegmentStopped(10 * WIN, 15 * WIN)]
    assert not seg.speaking


def test_a_dip_shorter_than_the_silence_keeps_the_turn() -> None:
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=500))
    probs = [0.9] * 5 + [0.2] * 15 + [0.9] * 5 + [0.2] * 16  # 480 ms dip, then 512 ms
    events = feed(seg, probs)
    assert events == [SegmentStarted(0, WIN), SegmentStopped(25 * WIN, 41 * WIN)]


def test_silence_uses_the_clock_so_a_gap_counts() -> None:
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=500))
    feed(seg, [0.9] * 3)
    # windows 3..19 were dropped; the next one ends 544 ms after the last speech
    assert seg.push(20 * WIN, 21 * WIN, 0.0) == (SegmentStopped(3 * WIN, 21 * WIN),)


def test_next_turn_never_starts_before_the_previous_end() -> None:
    seg = SpeechSegmenter(ServerVadConfig(prefix_padding_ms=300, silence_duration_ms=64))
    events = feed(seg, [0.9] * 10 + [0.0, 0.0] + [0.9])
    assert events == [
        SegmentStarted(0, WIN),
        SegmentStopped(10 * WIN, 12 * WIN),
        SegmentStarted(10 * WIN, 13 * WIN),  # 12 * WIN - 300 would overlap the last turn
    ]
    seg.reset(floor_ms=1000)
    assert not seg.speaking
    assert seg.push(1024, 1056, 0.9) == (SegmentStarted(1000, 1056),)


def test_reconfigure_applies_from_the_next_window() -> None:
    seg = SpeechSegmenter()
    assert feed(seg, [0.6]) == [SegmentStarted(0, WIN)]
    seg.reconfigure(ServerVadConfig(threshold=0.7, silence_duration_ms=0))
    assert seg.config.threshold == 0.7
    assert feed(seg, [0.6], first=1) == [SegmentStopped(WIN, 2 * WIN)]


def test_idle_timeout_fires_once_after_silence() -> None:
    seg = SpeechSegmenter(ServerVadConfig(idle_timeout_ms=10 * WIN))
    seg.arm_idle_timeout(2 * WIN)
    assert seg.idle_armed_at == 2 * WIN
    assert feed(seg, [0.1] * 11) == []
    assert feed(seg, [0.1], first=11) == [IdleTimeout(2 * WIN, 12 * WIN)]
    assert seg.idle_armed_at is None
    assert feed(seg, [0.1] * 40, first=12) == []


def test_idle_timeout_is_disarmed_by_speech_and_inert_without_a_value() -> None:
    seg = SpeechSegmenter(ServerVadConfig(idle_timeout_ms=10 * WIN, silence_duration_ms=WIN))
    seg.arm_idle_timeout(0)
    events = feed(seg, [0.1] * 5 + [0.9] + [0.1] * 30)
    assert [type(e) for e in events] == [SegmentStarted, SegmentStopped]
    seg.arm_idle_timeout(36 * WIN)
    seg.disarm_idle_timeout()
    assert feed(seg, [0.1] * 30, first=36) == []
    inert = SpeechSegmenter(ServerVadConfig(idle_timeout_ms=None))
    inert.arm_idle_timeout(0)
    assert feed(inert, [0.0] * 100) == []


def test_idle_timeout_waits_while_speaking() -> None:
    seg = SpeechSegmenter(ServerVadConfig(idle_timeout_ms=3 * WIN, silence_duration_ms=2 * WIN))
    feed(seg, [0.9])
    seg.arm_idle_timeout(WIN)  # armed mid-speech: the stop disarms it
    assert [type(e) for e in feed(seg, [0.9] * 5 + [0.0] * 10, first=1)] == [SegmentStopped]


def test_config_validation() -> None:
    for bad in (
        {"threshold": 1.5},
        {"threshold": float("nan")},
        {"prefix_padding_ms": -1},
        {"silence_duration_ms": -1},
        {"idle_timeout_ms": 0},
    ):
        with pytest.raises(ValueError):
            ServerVadConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SpeechSegmenter().push(10, 10, 0.5)


@given(st.lists(st.floats(0.0, 1.0), max_size=200), st.integers(0, 640), st.integers(0, 640))
def test_segments_alternate_and_never_overlap(probs: list[float], pad: int, hold: int) -> None:
    seg = SpeechSegmenter(ServerVadConfig(prefix_padding_ms=pad, silence_duration_ms=hold))
    events = feed(seg, probs)
    starts = [e for e in events if isinstance(e, SegmentStarted)]
    stops = [e for e in events if isinstance(e, SegmentStopped)]
    assert [type(e) for e in events] == [SegmentStarted, SegmentStopped] * len(stops) + [
        SegmentStarted
    ] * (len(starts) - len(stops))
    previous_end = 0
    for start, stop in zip(starts, [*stops, None], strict=False):
        assert previous_end <= start.audio_start_ms < start.detected_at_ms
        if stop is not None:
            assert start.detected_at_ms <= stop.audio_end_ms <= stop.detected_at_ms
            assert stop.detected_at_ms - stop.audio_end_ms >= hold
            previous_end = stop.audio_end_ms


def test_a_pause_is_told_once_and_speech_after_it_resumes() -> None:
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=10 * WIN, pause_ms=4 * WIN))
    assert feed(seg, [0.9] * 5 + [0.1] * 3) == [SegmentStarted(0, WIN)]
    assert feed(seg, [0.1] * 3, first=8) == [SegmentPaused(5 * WIN, 9 * WIN)]  # once
    assert feed(seg, [0.9], first=11) == [SegmentResumed(11 * WIN)]
    assert feed(seg, [0.9], first=12) == []  # resumed once
    events = feed(seg, [0.1] * 10, first=13)
    assert events == [SegmentPaused(13 * WIN, 17 * WIN), SegmentStopped(13 * WIN, 23 * WIN)]


def test_no_pauses_without_pause_ms_or_when_the_stop_decides_first() -> None:
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=4 * WIN))
    assert SegmentPaused not in {type(e) for e in feed(seg, [0.9] * 3 + [0.1] * 8)}
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=2 * WIN, pause_ms=3 * WIN))
    assert feed(seg, [0.9] * 3 + [0.1] * 8) == [
        SegmentStarted(0, WIN),
        SegmentStopped(3 * WIN, 5 * WIN),
    ]
    with pytest.raises(ValueError):
        ServerVadConfig(pause_ms=0)


@given(st.lists(st.floats(0.0, 1.0), max_size=200), st.integers(1, 640), st.integers(0, 640))
def test_pauses_fall_inside_segments_and_each_is_resumed_or_stopped(
    probs: list[float], pause: int, hold: int
) -> None:
    seg = SpeechSegmenter(ServerVadConfig(silence_duration_ms=hold, pause_ms=pause))
    events = feed(seg, probs)
    state = "idle"
    for event in events:  # idle -> speaking -> paused -> (speaking | idle)
        if isinstance(event, SegmentStarted):
            assert state == "idle"
            state = "speaking"
        elif isinstance(event, SegmentPaused):
            assert state == "speaking"
            assert pause <= event.detected_at_ms - event.audio_end_ms < hold
            state = "paused"
        elif isinstance(event, SegmentResumed):
            assert state == "paused"
            state = "speaking"
        elif isinstance(event, SegmentStopped):
            assert state in ("speaking", "paused")
            state = "idle"


def test_a_run_shorter_than_min_speech_ms_starts_nothing() -> None:
    """``min_speech_ms`` (the energy VAD's 60 ms): a click or a gap breaks the run."""
    seg = SpeechSegmenter(ServerVadConfig(prefix_padding_ms=0, min_speech_ms=3 * WIN))
    assert feed(seg, [0.9, 0.9, 0.1, 0.9, 0.9]) == []  # two runs of two windows
    assert seg.push(6 * WIN, 7 * WIN, 0.9) == ()  # a gap (window 5 dropped) breaks it too
    assert feed(seg, [0.9], first=7) == []
    assert feed(seg, [0.9], first=8) == [SegmentStarted(6 * WIN, 9 * WIN)]  # the run's start
    assert seg.speaking and seg.last_speech_end_ms == 9 * WIN
    with pytest.raises(ValueError):
        ServerVadConfig(min_speech_ms=-1)


@given(st.lists(st.booleans(), max_size=120), st.integers(0, 5), st.integers(1, 10))
def test_starts_need_the_run_and_stops_the_hangover(loud: list[bool], run: int, hang: int) -> None:
    """Against the rule read directly off the frames: a start at the first frame that
    ends a loud run of ``run`` frames (dated at the run's first frame), a stop once
    ``hang`` quiet frames follow the last loud one (dated at its end)."""
    seg = SpeechSegmenter(
        ServerVadConfig(
            prefix_padding_ms=0, min_speech_ms=run * WIN, silence_duration_ms=hang * WIN
        )
    )
    got = feed(seg, [0.9 if x else 0.1 for x in loud])
    want: list[object] = []
    speaking, streak, quiet = False, 0, 0
    for k, x in enumerate(loud):
        streak = streak + 1 if x else 0
        if not speaking and x and streak >= max(run, 1):
            speaking, quiet = True, 0
            want.append(SegmentStarted((k + 1 - streak) * WIN, (k + 1) * WIN))
        elif speaking:
            quiet = 0 if x else quiet + 1
            if quiet >= hang:
                speaking = False
                want.append(SegmentStopped((k + 1 - quiet) * WIN, (k + 1) * WIN))
                streak = 0
    assert got == want
