"""Response lifecycle, fencing, input ledger and backpressure."""

import numpy as np

from duplex.sessions import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    AudioDelta,
    ErrorEvent,
    InputAudioCleared,
    InputAudioCommitted,
    ModelAppendAudio,
    ModelFailed,
    ModelFrame,
    ModelReset,
    ModelSignal,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    Send,
    TranscriptDelta,
    TurnState,
)

from .sessionkit import listening, machine, of, sends, silence, speaking


def test_created_once_before_deltas_and_done_carries_the_transcript():
    m = machine()
    effects = []
    for text in ["Hel", "", "lo"]:
        effects += m.handle(speaking(m, text), 0.1)
    effects += m.handle(speaking(m, "!", end=True), 0.2)
    names = [type(e).__name__ for e in sends(effects)]
    assert names[0] == "ResponseCreated" and names.count("ResponseCreated") == 1
    assert names.count("ResponseDone") == 1 and names[-2:] == ["ResponseDone", "ResponseListen"]
    done = of(effects, ResponseDone)[0]
    assert done.transcript == "".join(d.delta for d in of(effects, TranscriptDelta)) == "Hello!"
    assert (done.status, done.reason) == ("completed", "end_of_turn")
    assert done.audio_ms == 4 * 80
    seqs = [e.seq for e in effects if isinstance(e, Send)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_non_speaking_frame_closes_and_next_speaking_frame_opens_a_new_response():
    m = machine()
    first = m.handle(speaking(m, "a"), 0.0)
    closing = m.handle(listening(m), 0.1)
    assert [d.reason for d in of(closing, ResponseDone)] == ["model_listen"]
    assert of(closing, ResponseListen)[0].reason == "model_listen"
    second = m.handle(speaking(m, "b"), 0.2)
    a, b = of(first, ResponseCreated)[0], of(second, ResponseCreated)[0]
    assert a.response_id != b.response_id
    assert m.handle(listening(m), 0.3) != [] and m.handle(listening(m), 0.4) == []


def test_cancel_fences_old_epoch_output():
    m = machine()
    rid = of(m.handle(speaking(m, "a"), 0.0), ResponseCreated)[0].response_id
    effects = m.handle(ResponseCancel(rid, "c1"), 0.1)
    done = of(effects, ResponseDone)[0]
    assert (done.status, done.reason) == ("cancelled", "client_cancelled")
    assert of(effects, ModelReset)[0].epoch == m.epoch == 1
    for _ in range(3):
        assert m.handle(speaking(m, "stale", epoch=0), 0.2) == []
    assert m.statistics().stale_frames_dropped == 3
    fresh = m.handle(speaking(m, "new"), 0.3)
    assert of(fresh, ResponseCreated)[0].epoch == 1


def test_cancel_of_another_response_is_refused_with_its_event_id():
    m = machine()
    m.handle(speaking(m), 0.0)
    errs = of(m.handle(ResponseCancel("resp_other", "c9"), 0.1), ErrorEvent)
    assert [(e.code, e.event_id, e.param) for e in errs] == [
        ("response_not_active", "c9", "response_id")
    ]
    assert m.turn_state is TurnState.RESPONDING


def test_commit_and_response_create_need_input():
    m = machine()
    assert of(m.handle(AudioCommit("k1"), 0.0), ErrorEvent)[0].code == "input_audio_buffer_empty"
    assert of(m.handle(ResponseCreate("r1"), 0.0), ErrorEvent)[0].event_id == "r1"
    m.handle(silence(100), 0.1)
    effects = m.handle(AudioCommit("k2"), 0.2)
    committed = of(effects, InputAudioCommitted)[0]
    assert committed.turn_id == 1 and committed.audio_end_ms == 100
    assert of(effects, ModelSignal)[0].signal == "commit"
    assert of(m.handle(ResponseCreate(), 0.3), ModelSignal)[0].signal == "response_create"
    assert [h.role for h in m.history] == ["user"]


def test_pending_turns_backpressure_until_a_response_answers():
    m = machine(max_pending_turns=2)
    codes = []
    for i in range(3):
        m.handle(silence(20), i)
        codes += [e.code for e in of(m.handle(AudioCommit(f"k{i}"), i), ErrorEvent)]
    assert codes == ["input_backpressure"]
    m.handle(speaking(m), 4.0)
    assert of(m.handle(AudioCommit(), 4.1), ErrorEvent) == []


def test_pending_bytes_backpressure_is_an_error_not_a_drop():
    m = machine(max_pending_input_bytes=24_000 * 2 // 10)  # 100 ms of PCM16
    assert len(of(m.handle(silence(80), 0.0), ModelAppendAudio)) == 1
    refused = m.handle(silence(80), 0.1)
    assert of(refused, ModelAppendAudio) == []
    err = of(refused, ErrorEvent)[0]
    assert (err.code, err.type) == ("input_backpressure", "rate_limit_error")
    m.handle(ModelFrame(0, consumed_input_samples=1920), 0.2)
    assert len(of(m.handle(silence(80), 0.3), ModelAppendAudio)) == 1
    assert m.statistics().input.rejected_appends == 1


def test_audio_is_resampled_to_the_model_rate_and_clocked():
    m = machine()
    effects = m.handle(AudioAppend(np.zeros(1600, np.float32), 16_000), 0.0)
    appended = of(effects, ModelAppendAudio)[0]
    assert appended.pcm.size == 2400 and m.input_ms == 100


def test_clear_advances_epoch_and_closes_the_response():
    m = machine()
    m.handle(speaking(m, "x"), 0.0)
    m.handle(silence(100), 0.1)
    effects = m.handle(AudioClear("clr"), 0.2)
    assert [d.reason for d in of(effects, ResponseDone)] == ["input_cleared"]
    reset = of(effects, ModelReset)[0]
    assert reset.clear_input and reset.epoch == 1
    assert of(effects, InputAudioCleared)[0].epoch == 1
    assert of(m.handle(AudioCommit(), 0.3), ErrorEvent)[0].code == "input_audio_buffer_empty"


def test_model_failure_fails_the_response_and_reports_engine_error():
    m = machine()
    m.handle(speaking(m, "x"), 0.0)
    effects = m.handle(ModelFailed("engine died"), 0.1)
    assert [(d.status, d.reason) for d in of(effects, ResponseDone)] == [("failed", "engine_error")]
    err = of(effects, ErrorEvent)[0]
    assert (err.code, err.type) == ("engine_error", "server_error")
    assert m.epoch == 1 and m.turn_state is TurnState.LISTENING
    assert len(of(m.handle(speaking(m, "again"), 0.2), AudioDelta)) == 1
