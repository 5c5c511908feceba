"""One test per (session state, event type) cell, plus the turn-table cells."""

import numpy as np
import pytest

from duplex.sessions import (
    CLIENT_EVENT_TYPES,
    RUNTIME_EVENT_TYPES,
    AudioAppend,
    AudioClear,
    AudioCommit,
    ConnectionAttached,
    ConnectionDetached,
    ErrorEvent,
    EventAck,
    ModelFailed,
    ModelFrame,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    SessionClose,
    SessionConfig,
    SessionCreate,
    SessionMachine,
    SessionOptions,
    SessionResume,
    SessionState,
    SessionUpdate,
    SpeechStarted,
    SpeechStopped,
    Tick,
    TurnSignal,
    TurnState,
    VideoAppend,
)
from duplex.sessions._events import ItemCreate, ItemDelete, ItemRetrieve, ItemTruncate
from duplex.sessions._state import SESSION_TABLE, TURN_TABLE, Handle, Ignore, Reject

from .sessionkit import counter_random, of, speaking

SAMPLES = {
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
    ConnectionAttached: ConnectionAttached(7),
    ConnectionDetached: ConnectionDetached(1),
    Tick: Tick(),
    ModelFailed: ModelFailed("boom"),
    ItemCreate: ItemCreate("user", "hello", item_id="item_c", event_id="ev_icreate"),
    ItemRetrieve: ItemRetrieve("item_x", "ev_iretrieve"),
    ItemDelete: ItemDelete("item_x", "ev_idelete"),
    ItemTruncate: ItemTruncate("item_x", 0, 10, "ev_itruncate"),
}


def _in_state(state: SessionState) -> SessionMachine:
    m = SessionMachine(SessionConfig(vad="external"), random_bytes=counter_random())
    if state is not SessionState.AWAITING:
        m.handle(ConnectionAttached(1), 0.0)
    if state is SessionState.DETACHED:
        m.handle(EventAck(0), 0.0)  # a used session: one that heard nothing ends on detach
        m.handle(ConnectionDetached(1), 0.0)
    if state is SessionState.CLOSED:
        m.handle(SessionClose(), 0.0)
    assert m.state is state
    return m


def test_tables_are_complete():
    every = set(CLIENT_EVENT_TYPES) | set(RUNTIME_EVENT_TYPES)
    assert set(SAMPLES) == every
    for state in SessionState:
        assert set(SESSION_TABLE[state]) == every, state


@pytest.mark.parametrize("state", list(SessionState))
@pytest.mark.parametrize("event_type", list(SAMPLES), ids=lambda t: t.__name__)
def test_session_cell(state, event_type):
    m = _in_state(state)
    event = SAMPLES[event_type]
    rule = SESSION_TABLE[state][event_type]
    ignored = m.statistics().ignored_events
    effects = m.handle(event, 1.0, generation=1)
    errors = of(effects, ErrorEvent)
    if isinstance(rule, Ignore):
        assert effects == []
        assert m.statistics().ignored_events == ignored + 1
    elif isinstance(rule, Reject):
        assert len(errors) == 1
        assert errors[0].code == rule.error.code
        assert errors[0].event_id == event.event_id
        assert m.state is state
    else:
        assert isinstance(rule, Handle) and hasattr(m, rule.method)
        assert m.state is not SessionState.AWAITING or event_type is Tick


def _turn(state: TurnState) -> SessionMachine:
    m = _in_state(SessionState.ACTIVE)
    if state is not TurnState.LISTENING:
        m.handle(speaking(m), 0.1)
    if state is TurnState.PAUSED:
        m.handle(SpeechStarted(0.0), 0.2)
    assert m.turn_state is state
    return m


@pytest.mark.parametrize(("cell", "rule"), list(TURN_TABLE.items()), ids=str)
def test_turn_cell(cell, rule):
    state, event_type = cell
    m = _turn(state)
    m.handle(AudioAppend(np.zeros(240, np.float32)), 0.3)
    effects = m.handle(SAMPLES[event_type], 0.4)
    errors = of(effects, ErrorEvent)
    assert [e.code for e in errors] == [rule.error.code]
    assert errors[0].event_id == SAMPLES[event_type].event_id
    assert m.turn_state is state
