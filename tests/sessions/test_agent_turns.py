"""The session core with the agent cascade: it decides what to hear and when to answer
(`Transcribe`, `AgentReply`), paces the reply's chunks in real time, and cuts a reply
off when speech over it outlasts ``barge_in_ms`` (a backchannel does not)."""

from __future__ import annotations

import numpy as np

from duplex.sessions import (
    AgentChunk,
    AgentReply,
    AsrResult,
    AudioDelta,
    Capabilities,
    InputAudioCommitted,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    ModelReset,
    OverlapDecision,
    ResponseCreated,
    ResponseDone,
    SessionOptions,
    SessionUpdate,
    TextDelta,
    Tick,
    Transcribe,
    TranscriptDelta,
)
from duplex.sessions._generation import Transcription

from .sessionkit import RATE, loud, machine, of, silence

AGENT = Capabilities(agent_cascade=True)
TURNS = {
    "turn_policy": "turn_based",
    "vad_create_response": True,
    "vad_prefix_padding_ms": 300,
    "vad_hangover_ms": 500,
    "input_transcription": Transcription("whisper-1"),
}


def _speech(ms: float) -> np.ndarray:
    return np.full(int(RATE * ms / 1000), 0.1, np.float32)


def _user_turn(m, now: float = 0.0):
    """Speech then silence: the turn is committed and a response opened."""
    effects = m.handle(loud(480), now) + m.handle(silence(640), now + 0.1)
    return effects


def test_a_turn_is_heard_and_the_reply_waits_for_its_final_transcript():
    m = machine(caps=AGENT, **TURNS)
    effects = m.handle(loud(480), 0.0)
    (start,) = of(effects, Transcribe)
    assert start.end_ms is None
    effects = m.handle(AsrResult(start.item_id, "hello"), 0.05)
    assert [e.delta for e in of(effects, InputTranscriptionDelta)] == ["hello"]
    effects = m.handle(AsrResult(start.item_id, "help"), 0.06)  # a revision: no delta
    assert of(effects, InputTranscriptionDelta) == []
    effects = m.handle(silence(640), 0.1)
    (committed,) = of(effects, InputAudioCommitted)
    (end,) = of(effects, Transcribe)
    assert (end.item_id, end.start_ms, end.end_ms) == (start.item_id, 0.0, 480.0)
    assert committed.item_id == start.item_id
    assert len(of(effects, ResponseCreated)) == 1 and of(effects, AgentReply) == []
    effects = m.handle(AsrResult(start.item_id, "hello world", final=True), 0.2)
    (completed,) = of(effects, InputTranscriptionCompleted)
    assert completed.transcript == "hello world" and completed.audio_seconds > 0
    (reply,) = of(effects, AgentReply)
    assert reply.response_id == m.active_response_id
    assert [(i.role, i.text) for i in reply.context] == [("user", "hello world")]
    assert m.history[0].text == "hello world"


def test_transcription_events_only_when_transcription_is_on():
    turns = {**TURNS, "input_transcription": None}
    m = machine(caps=AGENT, **turns)
    effects = _user_turn(m)
    (end,) = [t for t in of(effects, Transcribe) if t.end_ms is not None]
    effects = m.handle(AsrResult(end.item_id, "hi", final=True), 0.2)
    assert of(effects, InputTranscriptionCompleted) == []
    assert len(of(effects, AgentReply)) == 1  # heard all the same: the agent needs it


def _answering(m):
    effects = _user_turn(m)
    (end,) = [t for t in of(effects, Transcribe) if t.end_ms is not None]
    (reply,) = of(m.handle(AsrResult(end.item_id, "hi", final=True), 0.2), AgentReply)
    return reply


def test_reply_chunks_are_paced_in_real_time_and_end_the_response():
    m = machine(caps=AGENT, **TURNS)
    reply = _answering(m)
    effects = m.handle(AgentChunk(reply.response_id, _speech(240), "You said:"), 1.0)
    assert len(of(effects, AudioDelta)) == 1  # one 80 ms frame at once, the rest on the clock
    assert [d.delta for d in of(effects, TranscriptDelta)] == ["You said:"]
    assert m.handle(Tick(), 1.05) == []
    assert len(of(m.handle(Tick(), 1.08), AudioDelta)) == 1
    effects = m.handle(AgentChunk(reply.response_id, final=True), 1.1)
    assert of(effects, ResponseDone) == []  # the last frame is still queued
    effects = m.handle(Tick(), 1.16)
    assert len(of(effects, AudioDelta)) == 1 and of(effects, ResponseDone) == []
    (done,) = of(m.handle(Tick(), 1.24), ResponseDone)  # once the last audio has played
    assert done.status == "completed" and done.transcript == "You said:"


def test_a_stream_that_ran_dry_plays_on_from_the_next_chunk():
    m = machine(caps=AGENT, **TURNS)
    reply = _answering(m)
    m.handle(AgentChunk(reply.response_id, _speech(80), "a"), 1.0)
    effects = m.handle(AgentChunk(reply.response_id, _speech(160), " b"), 3.0)
    assert len(of(effects, AudioDelta)) == 1  # not a burst to catch up two seconds
    assert len(of(m.handle(Tick(), 3.08), AudioDelta)) == 1


def test_text_only_replies_send_text_at_once():
    m = machine(caps=AGENT, **{**TURNS, "output_modalities": "text"})
    reply = _answering(m)
    assert reply.settings.text_only
    effects = []
    for word in ("You", " said", " hi."):
        effects += m.handle(AgentChunk(reply.response_id, text=word), 1.0)
    effects += m.handle(AgentChunk(reply.response_id, final=True), 1.0)
    assert "".join(d.delta for d in of(effects, TextDelta)) == "You said hi."
    assert of(effects, AudioDelta) == []
    assert of(effects, ResponseDone)[0].status == "completed"


def test_speech_over_the_reply_past_barge_in_ms_cancels_it_and_history_keeps_what_was_sent():
    m = machine(caps=AGENT, **TURNS)
    reply = _answering(m)
    m.handle(AgentChunk(reply.response_id, _speech(2000), "A long answer."), 1.0)
    m.handle(Tick(), 1.08)  # two frames out: 160 ms
    effects = m.handle(loud(200), 1.1)  # speech starts: output pauses at once
    assert [d.action for d in of(effects, OverlapDecision)] == ["pause"]
    effects = m.handle(Tick(), 1.2)
    assert of(effects, AudioDelta) == []  # held, not sent
    effects = m.handle(loud(1000), 1.3)
    (done,) = of(effects, ResponseDone)
    assert (done.status, done.reason) == ("cancelled", "barge_in")
    assert any(isinstance(e, ModelReset) for e in effects)  # the runtime cancels the reply
    late = m.handle(AgentChunk(reply.response_id, _speech(80), " more"), 1.4)
    assert of(late, AudioDelta) == [] and m.statistics().agent_chunks_dropped == 1
    (item,) = [i for i in m.history if i.role == "assistant"]
    assert item.audio_ms == 160.0 and item.text == "A long answer."


def test_a_backchannel_does_not_interrupt_the_reply():
    m = machine(caps=AGENT, **TURNS)
    reply = _answering(m)
    m.handle(AgentChunk(reply.response_id, _speech(4000), "A long answer."), 1.0)
    effects = m.handle(loud(200), 1.1) + m.handle(silence(600), 1.3)
    actions = [d.action for d in of(effects, OverlapDecision)]
    assert actions == ["pause", "drop"]  # paused, then classed a backchannel
    assert of(effects, ResponseDone) == []
    effects = m.handle(Tick(), 3.2)  # false-interruption timeout: output resumes
    assert [d.action for d in of(effects, OverlapDecision)] == ["resume"]
    assert of(effects, AudioDelta)
    assert m.active_response_id == reply.response_id


def test_without_the_agent_turn_based_sessions_still_replay():
    m = machine(**TURNS)
    effects = _user_turn(m)
    assert of(effects, Transcribe) == [] and of(effects, AgentReply) == []
    assert of(effects, AudioDelta)  # the replay starts at once


def test_a_reply_answers_tools_and_text_items_without_waiting():
    m = machine(caps=AGENT, turn_policy="turn_based", turn_detection="none")
    from duplex.sessions import ItemCreate, ResponseCreate

    m.handle(ItemCreate("user", "Weather in Paris?"), 0.0)
    effects = m.handle(ResponseCreate(), 0.1)
    (reply,) = of(effects, AgentReply)
    assert [i.text for i in reply.context] == ["Weather in Paris?"]
    assert m.handle(SessionUpdate(SessionOptions(instructions="Be terse.")), 0.2)
