"""Overlap policies: backchannel, listen, barge-in, false-interruption pause/resume."""

import pytest

from duplex.sessions import (
    AudioDelta,
    InputSpeechStarted,
    ModelReset,
    OverlapDecision,
    ResponseDone,
    SpeechStarted,
    SpeechStopped,
    Tick,
    TranscriptDelta,
    TurnSignal,
    TurnState,
)

from .sessionkit import listening, loud, machine, of, silence, speaking


def _responding(**config):
    m = machine(vad="external", **config)
    m.handle(speaking(m, "a"), 0.0)
    assert m.turn_state is TurnState.RESPONDING
    return m


def _decisions(effects):
    return [(d.action, d.reason) for d in of(effects, OverlapDecision)]


@pytest.mark.parametrize(
    ("overlap_ms", "expected"),
    [
        (300, ("drop", "backchannel")),
        (699, ("drop", "backchannel")),
        (700, ("listen", "short_overlap")),
        (999, ("listen", "short_overlap")),
        (1000, ("barge_in", "speech_over_barge_in_ms")),
    ],
)
def test_thresholds_on_speech_end(overlap_ms, expected):
    m = _responding(false_interruption_enabled=False)
    m.handle(SpeechStarted(0.0), 0.1)
    effects = m.handle(SpeechStopped(float(overlap_ms)), 0.2)
    assert _decisions(effects) == [expected]
    cancelled = of(effects, ResponseDone)
    if expected[0] == "barge_in":
        assert [(d.status, d.reason) for d in cancelled] == [("cancelled", "barge_in")]
        assert of(effects, ModelReset)[0].epoch == 1 == m.epoch
    else:
        assert cancelled == [] and m.turn_state is TurnState.RESPONDING and m.epoch == 0


def test_ongoing_speech_barges_in_once_input_reaches_barge_in_ms():
    m = _responding(false_interruption_enabled=False)
    m.handle(SpeechStarted(0.0), 0.0)
    before = []
    for i in range(12):  # 12 x 80 ms = 960 ms of overlapping input
        before += m.handle(silence(80), 0.08 * i)
    assert of(before, ResponseDone) == []
    effects = m.handle(silence(80), 1.0)  # 1040 ms
    assert _decisions(effects) == [("barge_in", "speech_over_barge_in_ms")]
    assert of(effects, OverlapDecision)[0].overlap_ms == pytest.approx(1040, abs=1)
    assert m.turn_state is TurnState.LISTENING and m.epoch == 1
    # Fencing: the model's in-flight frames of epoch 0 never reach the client.
    assert of(m.handle(speaking(m, "late", epoch=0), 1.1), AudioDelta) == []
    assert m.statistics().stale_frames_dropped == 1


def test_false_interruption_pauses_then_resumes_with_held_output_in_order():
    m = _responding()
    effects = m.handle(SpeechStarted(0.0), 1.0)
    assert _decisions(effects) == [("pause", "speech_started")]
    assert m.turn_state is TurnState.PAUSED
    held = [m.handle(speaking(m, t), 1.1 + i / 10) for i, t in enumerate("bcd")]
    assert all(of(e, AudioDelta) == [] for e in held)
    stop = m.handle(SpeechStopped(300.0), 1.5)
    assert _decisions(stop) == [("drop", "backchannel")]
    assert m.next_deadline() == pytest.approx(3.0)
    assert m.handle(Tick(), 2.9) == []
    resumed = m.handle(Tick(), 3.0)
    assert _decisions(resumed) == [("resume", "false_interruption")]
    texts = [e.delta for e in of(resumed, TranscriptDelta)]
    assert texts == ["b", "c", "d"]
    assert m.turn_state is TurnState.RESPONDING
    assert m.statistics().resumes == 1


def test_real_turn_during_pause_barges_in_and_drops_held_output():
    m = _responding()
    m.handle(SpeechStarted(0.0), 1.0)
    m.handle(speaking(m, "held"), 1.1)
    effects = m.handle(SpeechStopped(1200.0), 1.5)
    assert _decisions(effects) == [("barge_in", "speech_over_barge_in_ms")]
    done = of(effects, ResponseDone)[0]
    assert (done.status, done.transcript) == ("cancelled", "a")
    assert m.statistics().held_frames_dropped == 1
    assert m.handle(Tick(), 10.0) == []  # no resume after a barge-in


def test_false_interruption_disabled_keeps_streaming():
    m = _responding(false_interruption_enabled=False)
    m.handle(SpeechStarted(0.0), 0.1)
    assert len(of(m.handle(speaking(m, "b"), 0.2), AudioDelta)) == 1


def test_ignore_policy_never_interrupts():
    m = _responding(overlap_policy="ignore")
    effects = m.handle(SpeechStarted(0.0), 0.1)
    assert _decisions(effects) == [("drop", "overlap_policy_ignore")]
    for i in range(30):
        assert of(m.handle(silence(80), 0.2 + i / 100), ResponseDone) == []
    m.handle(SpeechStopped(2400.0), 0.5)
    assert m.turn_state is TurnState.RESPONDING


def test_model_policy_lets_the_model_yield():
    m = _responding(overlap_policy="model")
    assert _decisions(m.handle(SpeechStarted(0.0), 0.1)) == [("listen", "model_decides")]
    m.handle(silence(2000), 0.2)
    assert m.turn_state is TurnState.RESPONDING
    done = of(m.handle(listening(m), 0.3), ResponseDone)[0]
    assert (done.status, done.reason) == ("completed", "turn_detected")


def test_response_opening_during_user_speech_starts_the_overlap():
    m = machine(vad="external", false_interruption_enabled=False)
    m.handle(SpeechStarted(0.0), 0.0)
    m.handle(silence(500), 0.5)
    m.handle(speaking(m, "x"), 0.5)  # overlap starts now, at 500 ms of input
    assert of(m.handle(silence(900), 1.4), ResponseDone) == []
    done = of(m.handle(silence(200), 1.6), ResponseDone)
    assert [d.reason for d in done] == ["barge_in"]


def test_energy_vad_drives_barge_in_end_to_end():
    m = machine(false_interruption_enabled=False)  # built-in energy VAD
    m.handle(speaking(m, "a"), 0.0)
    effects = []
    for i in range(15):
        effects += m.handle(loud(80), 0.1 + 0.08 * i)
    assert len(of(effects, InputSpeechStarted)) == 1
    assert [d.reason for d in of(effects, ResponseDone)] == ["barge_in"]


def test_client_turn_signal_barges_in():
    m = _responding()
    effects = m.handle(TurnSignal("barge_in", "client_vad", "sig1"), 0.2)
    assert _decisions(effects) == [("barge_in", "client_turn_signal")]
    assert of(effects, ModelReset)[0].reason == "barge_in"
    assert _decisions(m.handle(TurnSignal(), 0.3)) == [("drop", "no_active_response")]


@pytest.mark.parametrize(
    ("speech_ms", "expected"),
    [(400, ("drop", "backchannel")), (800, ("listen", "short_overlap"))],
)
def test_energy_vad_hangover_never_counts_as_overlap(speech_ms, expected):
    m = machine(false_interruption_enabled=False)  # the built-in energy VAD
    m.handle(speaking(m, "a"), 0.0)
    effects = []
    t = 0.0
    for _ in range(speech_ms // 80):
        effects += m.handle(loud(80), t)
        t += 0.08
    for _ in range(10):  # 800 ms of silence: the 300 ms hangover ends the speech
        effects += m.handle(silence(80), t)
        t += 0.08
    assert _decisions(effects) == [expected]
    decided = of(effects, OverlapDecision)[0]
    assert decided.overlap_ms == pytest.approx(speech_ms, abs=40)
    assert m.epoch == 0 and m.turn_state is TurnState.RESPONDING


def test_energy_vad_barges_in_after_barge_in_ms_of_real_speech():
    m = machine(false_interruption_enabled=False)
    m.handle(speaking(m, "a"), 0.0)
    t, effects = 0.0, []
    while not of(effects, ResponseDone):
        effects = m.handle(loud(80), t)
        t += 0.08
    assert _decisions(effects) == [("barge_in", "speech_over_barge_in_ms")]
    assert of(effects, OverlapDecision)[0].overlap_ms == pytest.approx(1000, abs=80)
    assert t == pytest.approx(1.04, abs=0.09)


def test_response_opening_in_the_vad_hangover_is_not_an_overlap():
    m = machine()  # the built-in energy VAD, false interruption on
    t = 0.0
    m.handle(loud(80), t)
    m.handle(loud(80), t + 0.08)  # 160 ms utterance; speech is active
    m.handle(silence(80), t + 0.16)  # quiet, but still inside the 300 ms hangover
    effects = m.handle(speaking(m, "a"), 0.25)  # the answer starts 80 ms after the user
    assert _decisions(effects) == []  # no pause, no overlap
    assert m.turn_state is TurnState.RESPONDING
    assert of(effects, AudioDelta)  # audio goes out at once, not held


def test_response_opening_while_the_user_still_speaks_is_an_overlap():
    m = machine()
    m.handle(loud(80), 0.0)
    m.handle(loud(80), 0.08)
    effects = m.handle(speaking(m, "a"), 0.17)
    assert _decisions(effects) == [("pause", "speech_started")]
    assert m.turn_state is TurnState.PAUSED
