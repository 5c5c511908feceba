"""``SessionReady``: told once, when the slot takes input, only to sessions that ask for it."""

from __future__ import annotations

from duplex.sessions import ConnectionAttached, ModelFrame, SessionCreated, SessionReady

from .sessionkit import machine, of, sends


def _held() -> ModelFrame:
    return ModelFrame(epoch=0, holds_input=True)


def _taking() -> ModelFrame:
    return ModelFrame(epoch=0)


def test_ready_waits_for_the_prompt_replay_and_is_told_once():
    m = machine(announce_ready=True)
    assert not of(m.handle(_held(), 0.1), SessionReady)
    assert not of(m.handle(_held(), 0.2), SessionReady)
    (ready,) = of(m.handle(_taking(), 0.3), SessionReady)
    assert ready.session_id == m.session_id
    assert not of(m.handle(_taking(), 0.4), SessionReady)  # once
    assert not of(m.handle(_held(), 0.5), SessionReady)  # a later reset replays: no second


def test_a_slot_ready_before_the_socket_attached_is_told_at_attach():
    m = machine(attach=False, announce_ready=True)
    assert m.handle(_taking(), 0.05) == []
    events = sends(m.handle(ConnectionAttached(1), 0.1))
    assert [type(e) for e in events] == [SessionCreated, SessionReady]


def test_a_frame_before_attach_that_still_holds_tells_nothing():
    m = machine(attach=False, announce_ready=True)
    m.handle(_held(), 0.05)
    assert [type(e) for e in sends(m.handle(ConnectionAttached(1), 0.1))] == [SessionCreated]
    assert of(m.handle(_taking(), 0.2), SessionReady)


def test_sessions_that_did_not_ask_are_never_told():
    m = machine()
    assert not of(m.handle(_taking(), 0.1), SessionReady)
    m = machine(attach=False)
    m.handle(_taking(), 0.05)
    assert [type(e) for e in sends(m.handle(ConnectionAttached(1), 0.1))] == [SessionCreated]
