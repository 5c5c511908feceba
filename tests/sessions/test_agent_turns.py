"""The session core with the agent cascade: it decides what to hear and when to answer
(`Transcribe`, `AgentReply`), paces the reply's chunks in real time, and cuts a reply
off when speech over it outlasts ``barge_in_ms`` (a backchannel does not)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.sessions import (
    AgentChunk,
    AgentReply,
    AgentToolCall,
    AsrResult,
    AudioDelta,
    CancelReply,
    Capabilities,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionTool,
    InputAudioCommitted,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    ItemCreate,
    ModelReset,
    OverlapDecision,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseOptions,
    SessionOptions,
    SessionUpdate,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    Tick,
    Transcribe,
    TranscriptDelta,
)
from duplex.sessions._generation import Transcription

from .sessionkit import RATE, loud, machine, of, sends, silence

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


def test_a_failed_transcription_says_failed_the_turn_is_answered_and_the_next_is_heard():
    """The ASR was lost mid-turn: ``input_audio_transcription.failed`` (not ``completed``)
    for that item, its reply answers what was heard before, and the next turn completes."""
    m = machine(caps=AGENT, **TURNS)
    effects = _user_turn(m)
    (end,) = [t for t in of(effects, Transcribe) if t.end_ms is not None]
    effects = m.handle(AsrResult(end.item_id, "hel", final=True, error="EngineUnavailable"), 0.2)
    (failed,) = of(effects, InputTranscriptionFailed)
    assert (failed.item_id, failed.code) == (end.item_id, "transcription_failed")
    assert "EngineUnavailable" not in failed.message  # the cause is logged, never sent
    assert of(effects, InputTranscriptionCompleted) == []
    (reply,) = of(effects, AgentReply)
    assert [(i.role, i.text) for i in reply.context] == [("user", "hel")]
    m.handle(AgentChunk(reply.response_id, final=True), 0.3)
    effects = _user_turn(m, 1.0)
    (again,) = [t for t in of(effects, Transcribe) if t.end_ms is not None]
    assert again.item_id != end.item_id
    effects = m.handle(AsrResult(again.item_id, "hello again", final=True), 1.2)
    assert of(effects, InputTranscriptionFailed) == []
    (completed,) = of(effects, InputTranscriptionCompleted)
    assert completed.transcript == "hello again"


def test_a_transcription_failed_mid_speech_is_not_asked_again_at_the_commit():
    """The ASR is lost while the user still speaks: ``failed`` then; the commit asks for no
    second transcript of that item (one answer per item), and the reply goes out at once
    with what was heard."""
    m = machine(caps=AGENT, **TURNS)
    effects = m.handle(loud(480), 0.0)
    (start,) = of(effects, Transcribe)
    m.handle(AsrResult(start.item_id, "hel"), 0.05)
    effects = m.handle(AsrResult(start.item_id, "hel", final=True, error="AsrProcessLost"), 0.06)
    assert [f.item_id for f in of(effects, InputTranscriptionFailed)] == [start.item_id]
    effects = m.handle(silence(640), 0.1)
    assert [c.item_id for c in of(effects, InputAudioCommitted)] == [start.item_id]
    assert of(effects, Transcribe) == []
    (reply,) = of(effects, AgentReply)
    assert [(i.role, i.text) for i in reply.context] == [("user", "hel")]


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


WEATHER = FunctionTool.of("get_weather", "Weather now", {"type": "object"})


def _tool_session(**extra):
    m = machine(
        caps=AGENT, turn_policy="turn_based", turn_detection="none", tools=(WEATHER,), **extra
    )
    m.handle(ItemCreate("user", "Weather in Paris?"), 0.0)
    (reply,) = of(m.handle(ResponseCreate(), 0.1), AgentReply)
    assert reply.tools == (WEATHER,)
    return m, reply


def test_a_tool_call_is_a_function_call_item_and_a_tool_output_is_answered():
    m, reply = _tool_session()
    rid = reply.response_id
    effects = m.handle(AgentChunk(rid, _speech(160), "Let me check."), 1.0)
    effects = m.handle(AgentToolCall(rid, "get_weather", '{"city": "Paris"}', "call_7"), 1.01)
    (call,) = of(effects, FunctionCallDone)
    assert (call.response_id, call.output_index, call.in_conversation) == (rid, 1, True)
    item = call.item
    assert (item.content, item.role, item.name, item.call_id, item.text) == (
        "function_call", "assistant", "get_weather", "call_7", '{"city": "Paris"}'
    )  # fmt: skip
    assert item in m.history  # in the conversation at once
    effects = m.handle(AgentChunk(rid, final=True, reason="tool_calls"), 1.02)
    assert of(effects, ResponseDone) == []  # the speech before the call still plays out
    (done,) = of(m.handle(Tick(), 1.2), ResponseDone)
    assert done.status == "completed" and done.calls == (item,)
    assert [(i.role, i.content) for i in m.history] == [
        ("user", "text"), ("assistant", "audio"), ("assistant", "function_call")
    ]  # fmt: skip
    # the app runs the tool and sends its output; the next reply sees the call and output
    output = ItemCreate("tool", "21 C, sunny", kind="function_call_output", call_id="call_7")
    m.handle(output, 2.0)
    (again,) = of(m.handle(ResponseCreate(), 2.1), AgentReply)
    assert [(i.content, i.call_id, i.text) for i in again.context][-2:] == [
        ("function_call", "call_7", '{"city": "Paris"}'),
        ("function_call_output", "call_7", "21 C, sunny"),
    ]


def test_a_call_without_an_id_gets_one_and_an_out_of_band_call_stays_out_of_history():
    m = machine(caps=AGENT, turn_policy="turn_based", turn_detection="none", tools=(WEATHER,))
    m.handle(ItemCreate("user", "Weather?"), 0.0)
    options = ResponseOptions(conversation="none", output_modalities="text")
    (reply,) = of(m.handle(ResponseCreate(options=options), 0.1), AgentReply)
    (call,) = of(
        m.handle(AgentToolCall(reply.response_id, "get_weather", "{}"), 0.2), FunctionCallDone
    )
    assert call.item.call_id.startswith("call_") and not call.in_conversation
    (done,) = of(
        m.handle(AgentChunk(reply.response_id, final=True, reason="tool_calls"), 0.3), ResponseDone
    )
    assert done.calls == (call.item,)
    assert [i.content for i in m.history] == ["text"]


def test_a_tool_call_of_a_cancelled_reply_is_dropped_and_counted():
    m, reply = _tool_session()
    m.handle(ResponseCancel(), 0.5)
    effects = m.handle(AgentToolCall(reply.response_id, "get_weather", "{}", "call_1"), 0.6)
    assert of(effects, FunctionCallDone) == []
    assert m.statistics().agent_chunks_dropped == 1
    assert all(i.content != "function_call" for i in m.history)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["text", "call"]), max_size=8), st.booleans())
def test_calls_are_numbered_after_the_message_and_listed_in_response_done(steps, text_only):
    m, reply = _tool_session(output_modalities="text" if text_only else "audio")
    rid, effects, now = reply.response_id, [], 1.0
    for index, step in enumerate(steps):
        now += 0.01
        if step == "text":
            effects += m.handle(
                AgentChunk(rid, b"" if text_only else _speech(80), f"w{index} "), now
            )
        else:
            effects += m.handle(AgentToolCall(rid, "get_weather", f'{{"n": {index}}}'), now)
    effects += m.handle(AgentChunk(rid, final=True), now)
    effects += m.handle(Tick(), now + 10.0)
    calls = of(effects, FunctionCallDone)
    assert [c.output_index for c in calls] == list(range(1, steps.count("call") + 1))
    assert len({c.item.call_id for c in calls}) == len(calls)
    (done,) = of(effects, ResponseDone)
    assert done.calls == tuple(c.item for c in calls)
    history_calls = [i for i in m.history if i.content == "function_call"]
    assert history_calls == [c.item for c in calls]
    message = [i.order for i in m.history if i.item_id == done.item_id]
    assert all(message[0] < c.order for c in history_calls) if message else True


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.text(max_size=6), min_size=1, max_size=8),
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.booleans(),
)
def test_a_streamed_call_grows_delta_by_delta_and_joins_the_conversation_whole(
    pieces, speech_between, last_has_text
):
    """However the arguments are cut into pieces (empty ones included), the deltas are the
    pieces, their concatenation is the item's arguments at its end, and the item joins the
    history only once whole."""
    m, reply = _tool_session()
    rid, now, effects = reply.response_id, 1.0, []
    body, last = (pieces[:-1], pieces[-1]) if last_has_text else (pieces, "")
    for index, piece in enumerate(body):
        now += 0.01
        if speech_between[index]:
            effects += m.handle(AgentChunk(rid, _speech(80), "w "), now)
        effects += m.handle(AgentToolCall(rid, "get_weather", piece, "c1", done=False), now)
        assert all(i.content != "function_call" for i in m.history)  # not whole yet
    effects += m.handle(AgentToolCall(rid, "get_weather", last, "c1"), now + 0.01)
    deltas = of(effects, FunctionCallDelta)
    (call,) = of(effects, FunctionCallDone)
    assert deltas[0].opens and not any(d.opens for d in deltas[1:])
    assert [d.delta for d in deltas[1:]] == [p for p in [*body, last][1:] if p] or len(deltas) == 1
    assert "".join(d.delta for d in deltas) == "".join(pieces) == call.item.text
    assert {d.output_index for d in deltas} == {call.output_index} == {1}
    assert {d.item.item_id for d in deltas} == {call.item.item_id}
    assert deltas[-1].item.text == call.item.text and call.complete
    assert [i for i in m.history if i.content == "function_call"] == [call.item]
    (done,) = of(m.handle(AgentChunk(rid, final=True), now + 0.1) + m.handle(Tick(), 60.0),
                 ResponseDone)  # fmt: skip
    assert done.calls == (call.item,)


def test_a_call_cut_off_by_a_cancel_is_closed_incomplete_and_kept_out_of_history():
    m, reply = _tool_session()
    rid = reply.response_id
    m.handle(AgentToolCall(rid, "get_weather", '{"ci', "c1", done=False), 0.2)
    effects = m.handle(ResponseCancel(), 0.3)
    (call,) = of(effects, FunctionCallDone)
    (done,) = of(effects, ResponseDone)
    assert not call.complete and call.item.text == '{"ci' and done.calls == (call.item,)
    assert sends(effects).index(call) < sends(effects).index(done)
    assert m.statistics().tool_calls_cut == 1
    assert all(i.content != "function_call" for i in m.history)
    # its later pieces are dropped and counted; the session goes on
    later = m.handle(AgentToolCall(rid, "get_weather", 'ty": 1}', "c1"), 0.4)
    assert of(later, FunctionCallDelta) == [] and of(later, FunctionCallDone) == []
    assert m.statistics().agent_chunks_dropped == 1
    (again,) = of(m.handle(ResponseCreate(), 0.5), AgentReply)
    whole = m.handle(AgentToolCall(again.response_id, "get_weather", "{}", "c2"), 0.6)
    assert [c.complete for c in of(whole, FunctionCallDone)] == [True]


def test_a_new_call_cuts_off_the_one_still_open():
    m, reply = _tool_session()
    rid = reply.response_id
    effects = m.handle(AgentToolCall(rid, "get_weather", "{", "c1", done=False), 0.2)
    effects += m.handle(AgentToolCall(rid, "get_weather", "{}", "c2"), 0.3)
    first, second = of(effects, FunctionCallDone)
    assert (first.complete, first.output_index, second.complete, second.output_index) == (
        False, 1, True, 2
    )  # fmt: skip
    assert [i.call_id for i in m.history if i.content == "function_call"] == ["c2"]
    assert m.statistics().tool_calls_cut == 1


# ------------------------------------------------ replies prepared at a pause

PREPARED = {**TURNS, "vad": "external", "vad_prepare_ms": 200}


def _paused_turn(m, text: str = "hello", *, at: float = 600.0):
    """1 s of input, speech from 100 ms, a pause at ``at``; the provisional transcript
    comes back and the prepared reply is asked for. Returns (item id, prepared reply)."""
    m.handle(silence(1000), 0.0)
    m.handle(SpeechStarted(100.0), 0.1)
    (peek,) = of(m.handle(SpeechPaused(at), 0.2), Transcribe)
    assert peek.provisional and peek.end_ms == at and peek.start_ms == 0.0
    effects = m.handle(AsrResult(peek.item_id, text, until_ms=at), 0.25)
    (reply,) = of(effects, AgentReply)
    assert reply.context[-1].text == text and reply.context[-1].role == "user"
    assert sends(effects) == [] or all(
        isinstance(e, InputTranscriptionDelta) for e in sends(effects)
    )  # nothing of the reply reaches the client
    return peek.item_id, reply


def test_a_reply_prepared_at_a_pause_plays_as_soon_as_the_turn_is_committed():
    m = machine(caps=AGENT, **PREPARED)
    item_id, reply = _paused_turn(m)
    effects = m.handle(AgentChunk(reply.response_id, _speech(240), "You said: hello."), 0.3)
    assert of(effects, AudioDelta) == [] and of(effects, ResponseCreated) == []  # held
    effects = m.handle(SpeechStopped(600.0), 0.5)  # the silence reached: committed
    (created,) = of(effects, ResponseCreated)
    (end,) = of(effects, Transcribe)
    assert (end.item_id, end.end_ms, end.provisional) == (item_id, 600.0, False)
    assert of(effects, AudioDelta) == []  # the final transcript decides
    effects = m.handle(AsrResult(item_id, "hello", final=True), 0.51)
    assert of(effects, AgentReply) == []  # no new reply: the prepared one plays at once
    (delta,) = of(effects, AudioDelta)
    assert delta.response_id == created.response_id
    assert [d.delta for d in of(effects, TranscriptDelta)] == ["You said: hello."]
    effects = m.handle(AgentChunk(reply.response_id, final=True), 0.52)  # later chunks too
    effects += m.handle(Tick(), 0.59) + m.handle(Tick(), 0.67) + m.handle(Tick(), 0.75)
    (done,) = of(effects, ResponseDone)
    assert done.response_id == created.response_id and done.status == "completed"
    stats = m.statistics()
    assert (stats.replies_prepared, stats.prepared_replies_used) == (1, 1)
    assert stats.prepared_replies_discarded == 0 and stats.agent_chunks_dropped == 0


def test_speech_that_resumes_after_the_pause_discards_the_prepared_reply():
    m = machine(caps=AGENT, **PREPARED)
    item_id, reply = _paused_turn(m)
    m.handle(AgentChunk(reply.response_id, _speech(80), "You said: hello."), 0.3)
    effects = m.handle(SpeechResumed(800.0), 0.35)
    assert of(effects, CancelReply) == [CancelReply(reply.response_id)]
    late = m.handle(AgentChunk(reply.response_id, _speech(80), " more"), 0.36)
    assert sends(late) == [] and m.statistics().agent_chunks_dropped == 1
    m.handle(silence(1000), 0.4)
    effects = m.handle(SpeechStopped(1500.0), 1.0)  # the turn ends later: answered as usual
    assert len(of(effects, ResponseCreated)) == 1 and of(effects, AudioDelta) == []
    assert [t.end_ms for t in of(effects, Transcribe)] == [1500.0]
    effects = m.handle(AsrResult(item_id, "hello there", final=True), 1.1)
    (again,) = of(effects, AgentReply)
    assert again.response_id == m.active_response_id and again.context[-1].text == "hello there"
    assert m.statistics().prepared_replies_discarded == 1


def test_a_final_transcript_unlike_the_prepared_one_gets_a_fresh_reply():
    m = machine(caps=AGENT, **PREPARED)
    item_id, reply = _paused_turn(m, "hello")
    m.handle(AgentChunk(reply.response_id, _speech(80), "You said: hello."), 0.3)
    m.handle(SpeechStopped(600.0), 0.5)
    effects = m.handle(AsrResult(item_id, "hello world", final=True), 0.51)
    assert of(effects, CancelReply) == [CancelReply(reply.response_id)]
    assert of(effects, AudioDelta) == []  # nothing of the prepared reply was heard
    (fresh,) = of(effects, AgentReply)
    assert fresh.response_id == m.active_response_id
    assert fresh.context[-1].text == "hello world"


def test_a_stop_elsewhere_or_a_changed_setting_discards_the_prepared_reply():
    m = machine(caps=AGENT, **PREPARED)
    _, reply = _paused_turn(m)
    effects = m.handle(SpeechStopped(700.0), 0.5)  # not where the pause began
    assert of(effects, CancelReply) == [CancelReply(reply.response_id)]
    m2 = machine(caps=AGENT, **PREPARED)
    _, reply2 = _paused_turn(m2)
    m2.handle(SessionUpdate(SessionOptions(instructions="Be terse.")), 0.3)
    effects = m2.handle(SpeechStopped(600.0), 0.5)
    assert of(effects, CancelReply) == [CancelReply(reply2.response_id)]
    assert m2.statistics().prepared_replies_discarded == 1


def test_pauses_prepare_nothing_without_the_setting_or_during_a_reply():
    m = machine(caps=AGENT, **{**PREPARED, "vad_prepare_ms": 0})
    m.handle(silence(1000), 0.0)
    m.handle(SpeechStarted(100.0), 0.1)
    assert m.handle(SpeechPaused(600.0), 0.2) == []
    assert m.statistics().ignored_events == 1
    m = machine(caps=AGENT, **PREPARED)
    item_id, reply = _paused_turn(m)
    m.handle(AgentChunk(reply.response_id, _speech(4000), "A long answer."), 0.3)
    m.handle(SpeechStopped(600.0), 0.5)
    m.handle(AsrResult(item_id, "hello", final=True), 0.51)  # the reply plays
    m.handle(silence(1000), 0.6)
    m.handle(SpeechStarted(1700.0), 0.7)  # speech over the reply: the overlap policy's
    assert of(m.handle(SpeechPaused(1900.0), 0.8), Transcribe) == []


def test_a_played_prepared_reply_answers_nothing_more():
    # (ack_only, no acks: the reply is not in the history, which looks as it did then)
    m = machine(caps=AGENT, **PREPARED, playback_commit_policy="ack_only")
    item_id, reply = _paused_turn(m)
    m.handle(SpeechStopped(600.0), 0.5)
    m.handle(AsrResult(item_id, "hello", final=True), 0.51)
    effects = m.handle(AgentChunk(reply.response_id, _speech(80), "Hi.", final=True), 0.52)
    effects += m.handle(Tick(), 0.7)
    assert len(of(effects, ResponseDone)) == 1
    (again,) = of(m.handle(ResponseCreate(), 1.0), AgentReply)  # the app asks once more
    assert again.response_id == m.active_response_id != reply.response_id
    late = m.handle(AgentChunk(reply.response_id, _speech(80), " late"), 1.1)
    assert of(late, AudioDelta) == []
    assert m.statistics().prepared_replies_used == 1


def test_tools_a_reply_model_cannot_call_are_taken_with_a_warning():
    """``session.updated`` first (the tools are taken: a tool item still answers), then a
    ``tools_not_supported`` error naming the update; none when the model calls tools, and
    none for an update without tools."""
    from duplex.sessions import ErrorEvent, SessionUpdated

    update = SessionUpdate(SessionOptions(tools=(WEATHER,)), event_id="evt_tools")
    echo = machine(caps=AGENT, turn_policy="turn_based")
    kinds = sends(echo.handle(update, 0.1))
    assert [type(e) for e in kinds] == [SessionUpdated, ErrorEvent]
    warning = kinds[1]
    assert (warning.code, warning.param, warning.event_id) == (
        "tools_not_supported", "session.tools", "evt_tools",
    )  # fmt: skip
    assert not warning.update_refused  # an answer after the update, not its refusal
    assert echo.config.tools == (WEATHER,)
    plain = sends(echo.handle(SessionUpdate(SessionOptions(instructions="Hi")), 0.2))
    assert [type(e) for e in plain] == [SessionUpdated]
    llm = machine(caps=Capabilities(agent_cascade=True, reply_tools=True), turn_policy="turn_based")
    assert [type(e) for e in sends(llm.handle(update, 0.1))] == [SessionUpdated]
