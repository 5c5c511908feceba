"""Turn detection (``turn_detection``: none / server_vad) and the turn-based responder."""

import numpy as np
import pytest

from duplex.exceptions import ConfigError
from duplex.sessions import (
    AudioAppend,
    AudioCommit,
    AudioDelta,
    ErrorEvent,
    InputAudioCommitted,
    InputAudioTimeout,
    InputSpeechStarted,
    InputSpeechStopped,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    SessionConfig,
    SpeechStarted,
    Tick,
    TranscriptDelta,
    TurnState,
)

from .sessionkit import RATE, listening, loud, machine, of, silence, speaking

TURN_BASED = {
    "turn_policy": "turn_based",
    "vad_create_response": True,
    "vad_prefix_padding_ms": 300,
    "vad_hangover_ms": 500,
}


def _tone(ms: float, amplitude: float = 0.3) -> AudioAppend:
    n = int(RATE * ms / 1000)
    return AudioAppend((amplitude * np.sin(np.arange(n) * 0.2)).astype(np.float32))


def _pcm16(event: AudioAppend) -> bytes:
    return np.clip(np.round(event.pcm * 32768.0), -32768, 32767).astype("<i2").tobytes()


def _play(m, until: float, step: float = 0.08):
    """Ticks every ``step`` s up to ``until``; all effects, in order."""
    out = []
    t = 0.0
    while t <= until + 1e-9:
        out += m.handle(Tick(), t)
        t += step
    return out


def test_none_emits_no_speech_events_and_ignores_a_vad_actor():
    m = machine(turn_detection="none")
    effects = m.handle(loud(400), 0.1) + m.handle(silence(800), 0.2)
    assert of(effects, InputSpeechStarted) == [] and of(effects, InputSpeechStopped) == []
    ignored = m.statistics().ignored_events
    assert of(m.handle(SpeechStarted(0.0), 0.3), InputSpeechStarted) == []
    assert m.statistics().ignored_events == ignored + 1


def test_speech_events_carry_padded_start_and_the_future_item_id():
    m = machine(vad_prefix_padding_ms=300, vad_hangover_ms=300)
    m.handle(silence(1000), 0.0)
    started = of(m.handle(loud(400), 0.1), InputSpeechStarted)
    stopped = of(m.handle(silence(600), 0.2), InputSpeechStopped)
    assert [(s.audio_start_ms, s.item_id[:5]) for s in started] == [(700.0, "item_")]
    assert [(s.audio_end_ms, s.item_id) for s in stopped] == [(1400.0, started[0].item_id)]


def test_padding_never_reaches_before_zero_or_the_committed_audio():
    m = machine(vad_prefix_padding_ms=300)
    assert of(m.handle(loud(200), 0.0), InputSpeechStarted)[0].audio_start_ms == 0.0
    m.handle(silence(600), 0.1)
    m.handle(silence(100), 0.2)
    m.handle(AudioCommit(), 0.3)  # the buffer now starts at 900 ms
    started = of(m.handle(loud(200), 0.4), InputSpeechStarted)
    assert started[0].audio_start_ms == 900.0


def test_an_external_vad_start_is_padded_by_the_machine():
    m = machine(vad="external", vad_prefix_padding_ms=300)
    m.handle(silence(2000), 0.0)
    (started,) = of(m.handle(SpeechStarted(1500.0), 0.1), InputSpeechStarted)
    assert started.audio_start_ms == 1200.0


@pytest.mark.parametrize(("threshold", "speech"), [(0.5, True), (1.0, False), (0.0, True)])
def test_threshold_scales_the_energy_vad(threshold, speech):
    m = machine(vad_threshold=threshold)
    quiet = _tone(400, amplitude=0.01)  # RMS ~7 mRMS: over 3 (0.5), under 30 (1.0)
    assert bool(of(m.handle(quiet, 0.0), InputSpeechStarted)) is speech


def test_silence_duration_is_the_hangover():
    m = machine(vad_hangover_ms=800)
    m.handle(loud(400), 0.0)
    assert of(m.handle(silence(700), 0.1), InputSpeechStopped) == []
    assert [s.audio_end_ms for s in of(m.handle(silence(200), 0.2), InputSpeechStopped)] == [400]


def test_duplex_needs_interrupt_response():
    with pytest.raises(ConfigError, match="vad_interrupt_response"):
        SessionConfig(vad_interrupt_response=False)
    SessionConfig(turn_policy="turn_based", vad_interrupt_response=False)


def test_turn_based_stop_commits_and_the_responder_echoes_the_speech():
    m = machine(**TURN_BASED)
    speech = _tone(480)
    m.handle(silence(200), 0.0)
    effects = m.handle(speech, 0.1) + m.handle(silence(640), 0.2)
    (started,) = of(effects, InputSpeechStarted)
    (committed,) = of(effects, InputAudioCommitted)
    assert committed.item_id == started.item_id and committed.audio_end_ms == 680.0
    assert started.audio_start_ms == 0.0  # 200 ms of lead-in, padding 300
    assert len(of(effects, ResponseCreated)) == 1
    effects += _play(m, 1.0)
    audio = b"".join(d.pcm for d in of(effects, AudioDelta))
    assert audio == bytes(2 * 4800) + _pcm16(speech)  # [0, 680) ms: 200 ms lead-in + speech
    marks = [d.delta for d in of(effects, TranscriptDelta)]
    assert marks == [f"[{ms}]" for ms in range(0, 680, 80)]
    (done,) = of(effects, ResponseDone)
    assert (done.status, done.transcript) == ("completed", "".join(marks))
    assert [i.role for i in m.history] == ["user", "assistant"]
    assert m.history[1].audio_ms == 680.0


def test_the_responder_is_paced_one_frame_per_period():
    m = machine(**TURN_BASED)
    m.handle(_tone(480), 0.0)
    first = m.handle(silence(600), 1.0)  # stop -> response, first frame at once
    assert len(of(first, AudioDelta)) == 1
    assert m.next_deadline() == pytest.approx(1.08)
    assert of(m.handle(Tick(), 1.05), AudioDelta) == []
    assert len(of(m.handle(Tick(), 1.25), AudioDelta)) == 3  # catches up: 1.08, 1.16, 1.24


def test_turn_based_ignores_model_frames():
    m = machine(**TURN_BASED)
    for frame in (speaking(m, "x"), listening(m), speaking(m, "y", end=True)):
        assert m.handle(frame, 0.1) == []
    assert m.turn_state is TurnState.LISTENING
    assert m.statistics().model_frames_ignored == 3


def test_interrupt_response_cancels_on_speech_start():
    m = machine(**TURN_BASED)
    m.handle(_tone(800), 0.0)
    m.handle(silence(600), 1.0)  # response starts
    m.handle(Tick(), 1.08)
    epoch = m.epoch
    effects = m.handle(loud(200), 1.1)
    (done,) = of(effects, ResponseDone)
    assert (done.status, done.reason) == ("cancelled", "turn_detected")
    assert m.epoch == epoch + 1
    assert of(m.handle(Tick(), 2.0), AudioDelta) == []
    assert m.statistics().responder_frames_dropped > 0


def test_without_interrupt_speech_does_not_cancel_and_a_stop_is_skipped():
    m = machine(**TURN_BASED, vad_interrupt_response=False)
    m.handle(_tone(800), 0.0)
    m.handle(silence(600), 1.0)
    effects = m.handle(loud(200), 1.1) + m.handle(silence(600), 1.15)
    assert of(effects, ResponseDone) == []
    assert len(of(effects, InputAudioCommitted)) == 1  # the turn is kept...
    assert m.statistics().auto_turns_skipped == 1  # ...but no second response opens


def test_create_response_false_commits_nothing():
    m = machine(turn_policy="turn_based", vad_create_response=False)
    effects = m.handle(loud(400), 0.0) + m.handle(silence(600), 0.1)
    assert len(of(effects, InputSpeechStopped)) == 1
    assert of(effects, InputAudioCommitted) == [] and of(effects, ResponseCreated) == []


def test_idle_timeout_commits_the_silence_and_responds():
    m = machine(**TURN_BASED, vad_idle_timeout_ms=2000)
    assert of(m.handle(silence(1900), 0.0), InputAudioTimeout) == []
    effects = m.handle(silence(200), 0.1)
    (timeout,) = of(effects, InputAudioTimeout)
    (committed,) = of(effects, InputAudioCommitted)
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (0.0, 2100.0)
    assert committed.item_id == timeout.item_id
    assert len(of(effects, ResponseCreated)) == 1


def test_idle_timeout_counts_from_the_end_of_the_last_response():
    m = machine(**TURN_BASED, vad_idle_timeout_ms=1000)
    m.handle(_tone(160), 0.0)
    m.handle(silence(600), 0.1)  # stop at 160 -> response of 2 frames
    _play(m, 0.3)
    assert m.active_response_id is None
    assert of(m.handle(silence(900), 0.4), InputAudioTimeout) == []  # 760 + 900 < 1000 after
    (timeout,) = of(m.handle(silence(200), 0.5), InputAudioTimeout)
    assert timeout.audio_start_ms == 760.0


def test_manual_turns_without_detection():
    m = machine(turn_policy="turn_based", turn_detection="none")
    speech = _tone(160)
    m.handle(speech, 0.0)
    (err,) = of(m.handle(ResponseCreate("r0"), 0.05), ErrorEvent)
    assert (err.code, err.event_id) == ("input_audio_buffer_empty", "r0")
    m.handle(AudioCommit(), 0.1)
    m.handle(AudioCommit(), 0.1)  # an empty commit is refused, turns are not counted
    effects = m.handle(ResponseCreate(), 0.2) + _play(m, 0.5)
    assert b"".join(d.pcm for d in of(effects, AudioDelta)) == _pcm16(speech)
    assert len(of(effects, ResponseDone)) == 1
    for _ in range(6):  # turn-based commits never hit the pending-turns limit
        m.handle(silence(80), 1.0)
        assert of(m.handle(AudioCommit(), 1.0), ErrorEvent) == []


def test_a_manual_commit_during_speech_hands_its_item_over():
    m = machine(**TURN_BASED)
    (started,) = of(m.handle(loud(400), 0.0), InputSpeechStarted)
    (committed,) = of(m.handle(AudioCommit(), 0.1), InputAudioCommitted)
    assert committed.item_id == started.item_id
    (stopped,) = of(m.handle(loud(100), 0.2) + m.handle(silence(600), 0.3), InputSpeechStopped)
    assert stopped.item_id not in ("", started.item_id)


def test_duplex_create_response_commits_on_a_stop():
    m = machine(vad_create_response=True)
    effects = m.handle(loud(400), 0.0) + m.handle(silence(400), 0.1)
    (stopped,) = of(effects, InputSpeechStopped)
    (committed,) = of(effects, InputAudioCommitted)
    assert committed.item_id == stopped.item_id and committed.audio_end_ms == 400.0
    signals = [e.signal for e in effects if type(e).__name__ == "ModelSignal"]
    assert signals == ["commit", "response_create"]


def test_vad_settings_change_restarts_detection_mid_speech():
    m = machine(**TURN_BASED)
    m.handle(loud(400), 0.0)
    m.handle(SessionUpdate_(turn_detection="none"), 0.1)
    effects = m.handle(silence(800), 0.2)
    assert of(effects, InputSpeechStopped) == [] and of(effects, InputAudioCommitted) == []


def SessionUpdate_(**options):
    from duplex.sessions import SessionOptions, SessionUpdate

    return SessionUpdate(SessionOptions(**options))
