"""Every (session state, event type) and (turn state, event type) cell, written out.

The expected rule of each cell is a literal here, never read back from
``SESSION_TABLE`` or ``TURN_TABLE``: a wrong row fails `test_session_table_is_written_out`.
Then real machines, driven into each state, show what the rules mean: an ``Ignore``
cell only counts ``ignored_events``; a ``Reject`` cell answers exactly one ``error``
with its code and message and changes nothing else; a ``Handle`` cell runs its handler
(the observation of each one is written out too).
"""

from __future__ import annotations

import numpy as np
import pytest

from duplex.exceptions import (
    IllegalState,
    ResponseAlreadyActive,
    ResponseNotActive,
    SessionClosed,
)
from duplex.sessions import (
    CLIENT_EVENT_TYPES,
    RUNTIME_EVENT_TYPES,
    AgentChunk,
    AgentToolCall,
    AsrResult,
    AudioAppend,
    AudioClear,
    AudioCommit,
    ConnectionAttached,
    ConnectionDetached,
    Effect,
    ErrorEvent,
    Event,
    EventAck,
    ModelFailed,
    ModelFrame,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    Send,
    SessionClose,
    SessionConfig,
    SessionCreate,
    SessionMachine,
    SessionOptions,
    SessionResume,
    SessionState,
    SessionUpdate,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    Tick,
    TurnSignal,
    TurnState,
    VideoAppend,
)
from duplex.sessions._events import ItemCreate, ItemDelete, ItemRetrieve, ItemTruncate
from duplex.sessions._state import SESSION_TABLE, TURN_TABLE, Handle, Ignore, Reject

from .sessionkit import counter_random, speaking

AWAITING, ACTIVE, DETACHED, CLOSED = (
    SessionState.AWAITING,
    SessionState.ACTIVE,
    SessionState.DETACHED,
    SessionState.CLOSED,
)
LISTENING, RESPONDING, PAUSED = TurnState.LISTENING, TurnState.RESPONDING, TurnState.PAUSED

# ------------------------------------------------------------ the expected rules

NO_SOCKET = Ignore("no_connection")
NOT_STARTED = Ignore("not_started")
OVER = Ignore("closed")
GONE = Reject(SessionClosed, "the session is closed")
CREATE_ONCE = Reject(IllegalState, "session.create is only valid before a session exists")
RESUME_FIRST = Reject(IllegalState, "session.resume must be a new connection's first message")
H = Handle
FIRST, RESUME, LATE = H("_on_first_attach"), H("_on_resume_attach"), H("_on_closed_attach")
TICK = H("_on_tick")

EXPECTED_SESSION: dict[type, tuple[object, object, object, object]] = {
    # event type        AWAITING    ACTIVE                       DETACHED    CLOSED
    SessionCreate:      (NO_SOCKET,  CREATE_ONCE,                 NO_SOCKET,  GONE),
    SessionUpdate:      (NO_SOCKET,  H("_on_session_update"),     NO_SOCKET,  GONE),
    AudioAppend:        (NO_SOCKET,  H("_on_audio_append"),       NO_SOCKET,  GONE),
    AudioCommit:        (NO_SOCKET,  H("_on_audio_commit"),       NO_SOCKET,  GONE),
    AudioClear:         (NO_SOCKET,  H("_on_audio_clear"),        NO_SOCKET,  GONE),
    TurnSignal:         (NO_SOCKET,  H("_on_turn_signal"),        NO_SOCKET,  GONE),
    PlaybackAck:        (NO_SOCKET,  H("_on_playback_ack"),       NO_SOCKET,  GONE),
    ResponseCreate:     (NO_SOCKET,  H("_on_response_create"),    NO_SOCKET,  GONE),
    ResponseCancel:     (NO_SOCKET,  H("_on_response_cancel"),    NO_SOCKET,  GONE),
    SessionResume:      (NO_SOCKET,  RESUME_FIRST,                NO_SOCKET,  GONE),
    EventAck:           (NO_SOCKET,  H("_on_event_ack"),          NO_SOCKET,  GONE),
    SessionClose:       (NO_SOCKET,  H("_on_session_close"),      NO_SOCKET,  GONE),
    VideoAppend:        (NO_SOCKET,  H("_on_video_append"),       NO_SOCKET,  GONE),
    ItemCreate:         (NO_SOCKET,  H("_on_item"),               NO_SOCKET,  GONE),
    ItemRetrieve:       (NO_SOCKET,  H("_on_item"),               NO_SOCKET,  GONE),
    ItemDelete:         (NO_SOCKET,  H("_on_item"),               NO_SOCKET,  GONE),
    ItemTruncate:       (NO_SOCKET,  H("_on_item"),               NO_SOCKET,  GONE),
    ModelFrame:         (H("_on_early_frame"), H("_on_model_frame"), H("_on_model_frame"), OVER),
    SpeechStarted:      (NOT_STARTED, H("_on_speech"),       H("_on_speech"),       OVER),
    SpeechStopped:      (NOT_STARTED, H("_on_speech"),       H("_on_speech"),       OVER),
    SpeechPaused:       (NOT_STARTED, H("_on_speech_pause"), H("_on_speech_pause"), OVER),
    SpeechResumed:      (NOT_STARTED, H("_on_speech_pause"), H("_on_speech_pause"), OVER),
    ModelFailed:        (NOT_STARTED, H("_on_model_failed"), H("_on_model_failed"), OVER),
    AsrResult:          (NOT_STARTED, H("_on_asr_result"),   H("_on_asr_result"),   OVER),
    AgentChunk:         (NOT_STARTED, H("_on_agent_chunk"),  H("_on_agent_chunk"),  OVER),
    AgentToolCall:      (NOT_STARTED, H("_on_agent_tool_call"), H("_on_agent_tool_call"),  OVER),
    ConnectionAttached: (FIRST,       RESUME,                RESUME,                LATE),
    ConnectionDetached: (NOT_STARTED, H("_on_detach"),       H("_on_detach"),       OVER),
    Tick:               (TICK,        TICK,                  TICK,                  TICK),
}  # fmt: skip
STATES = (AWAITING, ACTIVE, DETACHED, CLOSED)  # the columns above

EXPECTED_TURN = {
    (LISTENING, ResponseCancel): Reject(ResponseNotActive, "no response is active"),
    (RESPONDING, ResponseCreate): Reject(ResponseAlreadyActive, "a response is already active"),
    (PAUSED, ResponseCreate): Reject(
        ResponseAlreadyActive, "a response is already active (paused)"
    ),
}
"""The turn refinements; every other (turn, event) cell keeps the ACTIVE rule."""


def expected(state: SessionState, event_type: type) -> object:
    return EXPECTED_SESSION[event_type][STATES.index(state)]


CELLS = [(s, t) for t in EXPECTED_SESSION for s in STATES]


def _id(value: object) -> str:
    return value.name if isinstance(value, SessionState | TurnState) else value.__name__


# ----------------------------------------------------------- the tables as data


def test_every_event_type_has_a_row_and_every_state_a_column():
    every = set(CLIENT_EVENT_TYPES) | set(RUNTIME_EVENT_TYPES)
    assert set(EXPECTED_SESSION) == every
    assert set(SESSION_TABLE) == set(SessionState) == set(STATES)
    for state in SessionState:
        assert set(SESSION_TABLE[state]) == every, state


@pytest.mark.parametrize(("state", "event_type"), CELLS, ids=_id)
def test_session_table_is_written_out(state, event_type):
    assert SESSION_TABLE[state][event_type] == expected(state, event_type)


def test_turn_table_is_written_out():
    assert TURN_TABLE == EXPECTED_TURN


# ------------------------------------------------------------- real machines

SAMPLES: dict[type, Event] = {
    SessionCreate: SessionCreate(SessionOptions(), "ev_create"),
    SessionUpdate: SessionUpdate(SessionOptions(short_ack_ms=600), "ev_update"),
    AudioAppend: AudioAppend(np.zeros(240, np.float32), None, "ev_append"),
    AudioCommit: AudioCommit("ev_commit"),
    AudioClear: AudioClear("ev_clear"),
    TurnSignal: TurnSignal("barge_in", "client_vad", "ev_signal"),
    PlaybackAck: PlaybackAck("resp_x", 10, None, "ev_ack"),
    ResponseCreate: ResponseCreate("ev_rcreate"),
    ResponseCancel: ResponseCancel(None, "ev_rcancel"),
    SessionResume: SessionResume("duplex-x", "token", 0, "ev_resume"),
    EventAck: EventAck(0, "ev_eack"),
    SessionClose: SessionClose("ev_close"),
    VideoAppend: VideoAppend(b"\xff\xd8", "f1", 0, "jpeg", None, None, "ev_video"),
    ModelFrame: ModelFrame(0, b"\x00\x00" * 10, "hi", True),
    SpeechStarted: SpeechStarted(0.0),
    SpeechStopped: SpeechStopped(10.0),
    SpeechPaused: SpeechPaused(10.0),
    SpeechResumed: SpeechResumed(10.0),
    ConnectionAttached: ConnectionAttached(7),
    ConnectionDetached: ConnectionDetached(1),
    Tick: Tick(),
    ModelFailed: ModelFailed("boom"),
    AsrResult: AsrResult("item_x", "hello", final=True),
    AgentChunk: AgentChunk("resp_x", b"\x00\x00" * 10, "hi"),
    AgentToolCall: AgentToolCall("resp_x", "get_weather", "{}", "call_x"),
    ItemCreate: ItemCreate("user", "hello", item_id="item_c", event_id="ev_icreate"),
    ItemRetrieve: ItemRetrieve("item_x", "ev_iretrieve"),
    ItemDelete: ItemDelete("item_x", "ev_idelete"),
    ItemTruncate: ItemTruncate("item_x", 0, 10, "ev_itruncate"),
}


def _in_state(state: SessionState) -> SessionMachine:
    m = SessionMachine(SessionConfig(vad="external"), random_bytes=counter_random())
    if state is not AWAITING:
        m.handle(ConnectionAttached(1), 0.0)
    if state is DETACHED:
        m.handle(EventAck(0), 0.0)  # a used session: one that heard nothing ends on detach
        m.handle(ConnectionDetached(1), 0.0)
    if state is CLOSED:
        m.handle(SessionClose(), 0.0)
    assert m.state is state
    return m


def _turn(state: TurnState) -> SessionMachine:
    m = _in_state(ACTIVE)
    if state is not LISTENING:
        m.handle(speaking(m), 0.1)
    if state is PAUSED:
        m.handle(SpeechStarted(0.0), 0.2)
    assert m.turn_state is state
    return m


def _effect(effect: Effect) -> str:
    if not isinstance(effect, Send):
        return type(effect).__name__
    if isinstance(effect.event, ErrorEvent):
        return f"error:{effect.event.code}"
    return type(effect.event).__name__


def observe(m: SessionMachine, event: Event, now: float = 1.0) -> tuple[str, ...]:
    """Everything ``event`` visibly changed: its effects, then state and counter moves."""
    before, state, turn, input_ms = m.statistics(), m.state, m.turn_state, m.input_ms
    seen = [_effect(e) for e in m.handle(event, now, generation=1)]
    after = m.statistics()
    if m.state is not state:
        seen.append(f"state={m.state.value}")
    if m.turn_state is not turn:
        seen.append(f"turn={m.turn_state.value}")
    if m.input_ms != input_ms:
        seen.append(f"input_ms+{m.input_ms - input_ms:g}")
    for name in (
        "ignored_events",
        "errors",
        "events_journaled",
        "transcripts_dropped",
        "agent_chunks_dropped",
    ):
        moved = getattr(after, name) - getattr(before, name)
        if moved:
            seen.append(f"{name}+{moved}")
    if after.journal.acked_through != before.journal.acked_through:
        seen.append(f"acked_through={after.journal.acked_through}")
    return tuple(seen)


IGNORED = [(s, t) for s, t in CELLS if isinstance(expected(s, t), Ignore)]
REJECTED = [(s, t) for s, t in CELLS if isinstance(expected(s, t), Reject)]


@pytest.mark.parametrize(("state", "event_type"), IGNORED, ids=_id)
def test_an_ignore_cell_only_counts(state, event_type):
    m = _in_state(state)
    assert observe(m, SAMPLES[event_type]) == ("ignored_events+1",)


def _rejected(m: SessionMachine, event: Event, rule: Reject, *, journaled: bool) -> None:
    turn = m.turn_state
    effects = m.handle(event, 1.0, generation=1)
    assert len(effects) == 1 and isinstance(effects[0], Send), effects
    error = effects[0].event
    assert isinstance(error, ErrorEvent)
    assert (error.code, error.message, error.event_id) == (
        rule.error.code,
        rule.message,
        event.event_id,
    )
    assert effects[0].generation == 1  # to the socket it came from
    assert (effects[0].seq is not None) is journaled  # journaled only while ACTIVE
    assert m.turn_state is turn


@pytest.mark.parametrize(("state", "event_type"), REJECTED, ids=_id)
def test_a_reject_cell_answers_one_error_and_changes_nothing(state, event_type):
    m = _in_state(state)
    rule = expected(state, event_type)
    _rejected(m, SAMPLES[event_type], rule, journaled=state is ACTIVE)
    assert m.state is state
    assert m.statistics().errors == 1 and m.statistics().ignored_events == 0


def test_illegal_state_is_answered_for_create_and_resume_on_a_live_socket():
    for event in (SAMPLES[SessionCreate], SAMPLES[SessionResume]):
        m = _in_state(ACTIVE)
        assert observe(m, event) == ("error:illegal_state", "errors+1", "events_journaled+1")


@pytest.mark.parametrize("turn", list(TurnState), ids=_id)
@pytest.mark.parametrize("event_type", list(EXPECTED_SESSION), ids=_id)
def test_the_rule_in_each_turn_state(turn, event_type):
    m = _turn(turn)
    rule = EXPECTED_TURN.get((turn, event_type), expected(ACTIVE, event_type))
    assert m.rule_for(SAMPLES[event_type]) == rule


@pytest.mark.parametrize(("cell", "rule"), list(EXPECTED_TURN.items()), ids=str)
def test_a_turn_reject_cell_answers_one_error(cell, rule):
    turn, event_type = cell
    m = _turn(turn)
    m.handle(AudioAppend(np.zeros(240, np.float32)), 0.3)  # input, so create is not refused
    _rejected(m, SAMPLES[event_type], rule, journaled=True)
    assert m.state is ACTIVE


# (state, turn, events sent first, event) -> what the handler visibly did
Case = tuple[SessionState, TurnState, tuple[Event, ...], Event]
UPDATE = SessionUpdate(SessionOptions(short_ack_ms=600), "ev_update")
HANDLED: dict[str, tuple[Case, tuple[str, ...]]] = {
    "awaiting-attach": (
        (AWAITING, LISTENING, (), ConnectionAttached(7)),
        ("SessionCreated", "state=active"),
    ),
    "awaiting-tick": ((AWAITING, LISTENING, (), Tick()), ()),  # no timers yet; not ignored
    "awaiting-frame": (  # only readiness is noted (told at attach, if announce_ready)
        (AWAITING, LISTENING, (), SAMPLES[ModelFrame]),
        ("ignored_events+1",),
    ),
    "update": ((ACTIVE, LISTENING, (), UPDATE), ("SessionUpdated", "events_journaled+1")),
    "append": ((ACTIVE, LISTENING, (), SAMPLES[AudioAppend]), ("ModelAppendAudio", "input_ms+10")),
    "commit": (
        (ACTIVE, LISTENING, (SAMPLES[AudioAppend],), SAMPLES[AudioCommit]),
        ("InputAudioCommitted", "ModelSignal", "events_journaled+1"),
    ),
    "clear": (
        (ACTIVE, LISTENING, (), SAMPLES[AudioClear]),
        ("ModelReset", "InputAudioCleared", "events_journaled+1"),
    ),
    "signal-listening": (
        (ACTIVE, LISTENING, (), SAMPLES[TurnSignal]),
        ("OverlapDecision", "events_journaled+1"),
    ),
    "signal-responding": (
        (ACTIVE, RESPONDING, (), SAMPLES[TurnSignal]),
        ("OverlapDecision", "ResponseDone", "ModelReset", "turn=listening", "events_journaled+2"),
    ),
    "ack-unknown": (
        (ACTIVE, LISTENING, (), SAMPLES[PlaybackAck]),
        ("error:playback_item_not_found", "errors+1", "events_journaled+1"),
    ),
    "create-empty": (
        (ACTIVE, LISTENING, (), SAMPLES[ResponseCreate]),
        ("error:input_audio_buffer_empty", "errors+1", "events_journaled+1"),
    ),
    "create": (
        (ACTIVE, LISTENING, (SAMPLES[AudioAppend],), SAMPLES[ResponseCreate]),
        ("ModelSignal",),
    ),
    "cancel-responding": (
        (ACTIVE, RESPONDING, (), SAMPLES[ResponseCancel]),
        ("ResponseDone", "ModelReset", "turn=listening", "events_journaled+1"),
    ),
    "cancel-paused": (
        (ACTIVE, PAUSED, (), SAMPLES[ResponseCancel]),
        ("ResponseDone", "ModelReset", "turn=listening", "events_journaled+1"),
    ),
    "event-ack": (
        (ACTIVE, LISTENING, (UPDATE,), EventAck(1, "ev_eack")),
        ("acked_through=1",),
    ),
    "event-ack-future": (
        (ACTIVE, LISTENING, (), EventAck(1, "ev_eack")),
        ("error:bad_event", "errors+1", "events_journaled+1"),
    ),
    "close": (
        (ACTIVE, RESPONDING, (), SAMPLES[SessionClose]),
        (
            "ResponseDone",
            "SessionClosed",
            "CloseConnection",
            "ReleaseResources",
            "state=closed",
            "turn=listening",
            "events_journaled+2",
        ),
    ),
    "video-unsupported": (
        (ACTIVE, LISTENING, (), SAMPLES[VideoAppend]),
        ("error:video_input_unsupported", "errors+1", "events_journaled+1"),
    ),
    "item-create": (
        (ACTIVE, LISTENING, (), SAMPLES[ItemCreate]),
        ("ItemAdded", "events_journaled+1"),
    ),
    "item-retrieve": (
        (ACTIVE, LISTENING, (SAMPLES[ItemCreate],), ItemRetrieve("item_c", "ev_r")),
        ("ItemRetrieved", "events_journaled+1"),
    ),
    "item-delete": (
        (ACTIVE, LISTENING, (SAMPLES[ItemCreate],), ItemDelete("item_c", "ev_d")),
        ("ItemDeleted", "events_journaled+1"),
    ),
    "item-truncate-unknown": (
        (ACTIVE, LISTENING, (), SAMPLES[ItemTruncate]),
        ("error:item_not_found", "errors+1", "events_journaled+1"),
    ),
    "frame": (
        (ACTIVE, LISTENING, (), SAMPLES[ModelFrame]),
        (
            "ResponseCreated",
            "AudioDelta",
            "TranscriptDelta",
            "turn=responding",
            "events_journaled+3",
        ),
    ),
    "speech-started": (
        (ACTIVE, LISTENING, (), SAMPLES[SpeechStarted]),
        ("InputSpeechStarted", "events_journaled+1"),
    ),
    "speech-stopped": (
        (ACTIVE, LISTENING, (SAMPLES[SpeechStarted],), SAMPLES[SpeechStopped]),
        ("InputSpeechStopped", "events_journaled+1"),
    ),
    "attach-without-resume": (
        (ACTIVE, LISTENING, (), ConnectionAttached(7)),
        ("error:illegal_state", "CloseConnection"),
    ),
    "detach": ((ACTIVE, LISTENING, (UPDATE,), ConnectionDetached(1)), ("state=detached",)),
    "detach-unused": (  # its client sent nothing: nothing to resume, no slot held for the grace
        (ACTIVE, LISTENING, (), ConnectionDetached(1)),
        ("ReleaseResources", "state=closed", "events_journaled+1"),
    ),
    "tick": ((ACTIVE, LISTENING, (), Tick()), ()),  # timers ran, none due; not ignored
    "failed": (
        (ACTIVE, RESPONDING, (), SAMPLES[ModelFailed]),
        (
            "ResponseDone",
            "error:engine_error",
            "ModelReset",
            "turn=listening",
            "events_journaled+2",
        ),
    ),
    "detached-frame": (
        (DETACHED, LISTENING, (), SAMPLES[ModelFrame]),
        ("turn=responding", "events_journaled+3"),  # journaled for the resume, not sent
    ),
    "detached-speech": (
        (DETACHED, LISTENING, (), SAMPLES[SpeechStarted]),
        ("events_journaled+1",),
    ),
    "detached-speech-stopped": (
        (DETACHED, LISTENING, (SAMPLES[SpeechStarted],), SAMPLES[SpeechStopped]),
        ("events_journaled+1",),
    ),
    "detached-tick": ((DETACHED, LISTENING, (), Tick()), ()),
    "detached-attach-without-resume": (
        (DETACHED, LISTENING, (), ConnectionAttached(7)),
        ("error:illegal_state", "CloseConnection"),
    ),
    "detached-stale-detach": (
        (DETACHED, LISTENING, (), ConnectionDetached(1)),
        ("ignored_events+1",),  # the handler counts a detach of no current socket
    ),
    "detached-failed": (
        (DETACHED, LISTENING, (), SAMPLES[ModelFailed]),
        ("ModelReset", "events_journaled+1"),
    ),
    "closed-attach": (
        (CLOSED, LISTENING, (), ConnectionAttached(7)),
        ("error:session_resume_expired", "CloseConnection"),
    ),
    "closed-tick": ((CLOSED, LISTENING, (), Tick()), ()),
    # no agent cascade here: nothing is being transcribed or answered, so both are dropped
    "asr-result": ((ACTIVE, LISTENING, (), SAMPLES[AsrResult]), ("transcripts_dropped+1",)),
    "agent-chunk": ((ACTIVE, LISTENING, (), SAMPLES[AgentChunk]), ("agent_chunks_dropped+1",)),
    "detached-asr-result": (
        (DETACHED, LISTENING, (), SAMPLES[AsrResult]),
        ("transcripts_dropped+1",),
    ),
    "detached-agent-chunk": (
        (DETACHED, LISTENING, (), SAMPLES[AgentChunk]),
        ("agent_chunks_dropped+1",),
    ),
    # no agent cascade (and no prepare pause) here: pauses prepare nothing
    "speech-paused": ((ACTIVE, LISTENING, (), SAMPLES[SpeechPaused]), ("ignored_events+1",)),
    "speech-resumed": ((ACTIVE, LISTENING, (), SAMPLES[SpeechResumed]), ("ignored_events+1",)),
    "detached-speech-paused": (
        (DETACHED, LISTENING, (), SAMPLES[SpeechPaused]),
        ("ignored_events+1",),
    ),
    "detached-speech-resumed": (
        (DETACHED, LISTENING, (), SAMPLES[SpeechResumed]),
        ("ignored_events+1",),
    ),
    "agent-tool-call": (
        (ACTIVE, LISTENING, (), SAMPLES[AgentToolCall]),
        ("agent_chunks_dropped+1",),
    ),
    "detached-agent-tool-call": (
        (DETACHED, LISTENING, (), SAMPLES[AgentToolCall]),
        ("agent_chunks_dropped+1",),
    ),
}


def test_every_handle_cell_is_observed():
    observed = {(case[0], type(case[3])) for case, _ in HANDLED.values()}
    handled = {(s, t) for s, t in CELLS if isinstance(expected(s, t), Handle)}
    assert handled == observed


@pytest.mark.parametrize("name", list(HANDLED))
def test_a_handle_cell_runs_its_handler(name):
    (state, turn, setup, event), seen = HANDLED[name]
    m = _turn(turn) if state is ACTIVE else _in_state(state)
    for before in setup:
        m.handle(before, 0.5, generation=1)
    assert m.rule_for(event) == expected(state, type(event))
    assert observe(m, event) == seen
