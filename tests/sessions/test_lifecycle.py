"""Creation, leases, close, resume with replay, token rotation, takeover."""

import hashlib
import hmac

import pytest

from duplex.sessions import (
    CLOSE_GOING_AWAY,
    CLOSE_POLICY_VIOLATION,
    CLOSE_SESSION_REPLACED,
    AudioCommit,
    CloseConnection,
    ConnectionAttached,
    ConnectionDetached,
    ErrorEvent,
    EventAck,
    ReleaseResources,
    Send,
    SessionClose,
    SessionClosed,
    SessionConfig,
    SessionCreated,
    SessionExpired,
    SessionMachine,
    SessionOptions,
    SessionReplaced,
    SessionResume,
    SessionResumed,
    SessionResyncRequired,
    SessionState,
    SessionUpdate,
    SessionUpdated,
    Tick,
    _resume,
)

from .sessionkit import counter_random, machine, of, silence, speaking


def _created():
    m = SessionMachine(SessionConfig(), random_bytes=counter_random())
    effects = m.handle(ConnectionAttached(1), 0.0)
    created = of(effects, SessionCreated)[0]
    return m, created, effects


def test_created_is_connection_scoped_and_carries_capabilities_and_token():
    m, created, effects = _created()
    assert effects == [Send(created, None, 1)]
    assert created.session_id == m.session_id and m.session_id.startswith("duplex-")
    assert len(created.resume_token) == 43 and created.attachment_generation == 1
    assert created.capabilities.supports_session_resume
    assert m.state is SessionState.ACTIVE


def test_token_is_stored_only_as_digest():
    m, created, _ = _created()
    cred = m._credential  # the test looks inside on purpose
    assert created.resume_token not in repr(vars(cred))
    assert cred._digest == hashlib.sha256(created.resume_token.encode()).digest()


def test_verify_uses_constant_time_compare(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(_resume.hmac, "compare_digest", spy)
    m, created, _ = _created()
    m.handle(EventAck(0), 0.5)  # a client that used its session (else detach ends it)
    m.handle(ConnectionDetached(1), 1.0)
    m.handle(ConnectionAttached(2, SessionResume(m.session_id, created.resume_token)), 2.0)
    assert len(calls) == 1 and all(len(x) == 32 for x in calls[0])


def test_update_and_idle_lease():
    m = machine()
    effects = m.handle(SessionUpdate(SessionOptions(overlap_policy="model")), 10.0)
    assert of(effects, SessionUpdated)[0].config.overlap_policy == "model"
    bad = m.handle(SessionUpdate(SessionOptions(short_ack_ms=5000), "u2"), 11.0)
    assert [(e.code, e.event_id, e.param) for e in of(bad, ErrorEvent)] == [
        ("bad_event", "u2", "session.barge_in_ms")
    ]
    assert m.next_deadline() == pytest.approx(71.0)  # journal TTL of session.updated + batch
    assert m.handle(Tick(), 71.0) == [] and m.statistics().journal.entries == 0
    assert m.next_deadline() == pytest.approx(311.0)
    assert m.handle(Tick(), 310.9) == []
    effects = m.handle(Tick(), 311.0)
    assert of(effects, SessionExpired)[0].reason == "idle_ttl_expired"
    assert of(effects, CloseConnection) == [
        CloseConnection(1, CLOSE_GOING_AWAY, "idle_ttl_expired")
    ]
    assert of(effects, ReleaseResources) == [ReleaseResources("idle_ttl_expired", expired=True)]
    assert m.state is SessionState.CLOSED and m.next_deadline() is None
    assert of(m.handle(AudioCommit("late"), 400.0, generation=1), ErrorEvent)[0].code == (
        "session_closed"
    )


def test_disconnect_grace_expires_and_releases_once():
    m = machine()
    m.handle(speaking(m, "a"), 1.0)
    m.handle(EventAck(0), 2.0)
    m.handle(ConnectionDetached(1), 5.0)
    assert m.state is SessionState.DETACHED and m.next_deadline() == 35.0
    assert m.handle(speaking(m, "b"), 6.0) == []  # journaled, nobody to send to
    effects = m.handle(Tick(), 35.0)
    assert of(effects, ReleaseResources) == [
        ReleaseResources("disconnect_grace_expired", expired=True)
    ]
    assert of(effects, CloseConnection) == []
    assert m.handle(Tick(), 99.0) == []


def test_a_session_detached_before_any_client_event_ends_at_once():
    """Connect, create, drop: nothing to resume, so no slot held for the grace (issue 12 #7)."""
    m = machine()
    m.handle(speaking(m, "a"), 1.0)  # model output alone is no sign of a client
    effects = m.handle(ConnectionDetached(1), 2.0)
    assert of(effects, ReleaseResources) == [
        ReleaseResources("detached_before_any_event", expired=True)
    ]
    assert m.state is SessionState.CLOSED and m.next_deadline() is None


def test_client_close():
    m = machine()
    m.handle(speaking(m), 0.0)
    effects = m.handle(SessionClose("bye"), 1.0)
    kinds = [type(e).__name__ for e in effects]
    assert kinds == ["Send", "Send", "CloseConnection", "ReleaseResources"]
    assert of(effects, SessionClosed)[0].reason == "client_close"


def test_resume_replays_after_cursor_and_rotates_token():
    m, created, _ = _created()
    journaled = []
    for i in range(4):
        journaled += [e for e in m.handle(speaking(m, str(i)), 1.0 + i) if isinstance(e, Send)]
    m.handle(EventAck(0), 4.5)
    m.handle(ConnectionDetached(1), 5.0)
    m.handle(speaking(m, "missed"), 6.0)
    cursor = journaled[2].seq
    effects = m.handle(
        ConnectionAttached(2, SessionResume(m.session_id, created.resume_token, cursor)), 7.0
    )
    resumed = effects[0].event
    assert isinstance(resumed, SessionResumed) and effects[0].seq is None
    assert resumed.config is m.config  # a new socket's projection learns the session's formats
    replayed = effects[1:]
    assert [e.seq for e in replayed] == list(range(cursor + 1, m.statistics().journal.last_seq + 1))
    assert all(e.generation == 2 for e in replayed) and resumed.replay_count == len(replayed)
    assert [e.event for e in replayed[: len(journaled) - 3]] == [e.event for e in journaled[3:]]
    assert resumed.resume_token != created.resume_token
    # The old token no longer works; the new one does.
    m.handle(ConnectionDetached(2), 8.0)
    stale = m.handle(ConnectionAttached(3, SessionResume(m.session_id, created.resume_token)), 9.0)
    (refused,) = of(stale, ErrorEvent)  # the refusal of an unknown id: nothing told
    assert refused.code == "session_resume_expired"
    assert refused.message == f"unknown or expired duplex session: {m.session_id}"
    assert of(stale, CloseConnection)[0] == CloseConnection(
        3, CLOSE_POLICY_VIOLATION, "session_resume_expired"
    )
    ok = m.handle(ConnectionAttached(4, SessionResume(m.session_id, resumed.resume_token, 99)), 9.5)
    assert isinstance(ok[0].event, SessionResumed) and m.generation == 4
    assert of(ok, SessionResyncRequired)[0].reason == "journal_gap"  # cursor beyond last


def test_takeover_replaces_the_old_socket_and_drops_its_late_events():
    m, created, _ = _created()
    effects = m.handle(
        ConnectionAttached(2, SessionResume(m.session_id, created.resume_token)), 1.0
    )
    assert effects[0] == Send(SessionReplaced(m.session_id, 2), None, 1)
    assert effects[1] == CloseConnection(1, CLOSE_SESSION_REPLACED, "session_replaced")
    assert isinstance(effects[2].event, SessionResumed) and effects[2].generation == 2
    assert m.handle(silence(80), 1.1, generation=1) == []
    assert m.statistics().stale_client_events == 1
    assert m.statistics().takeovers == 1


def test_resume_after_journal_overflow_requires_resync():
    m2 = SessionMachine(SessionConfig(journal_max_bytes=2000), random_bytes=counter_random())
    token = of(m2.handle(ConnectionAttached(1), 0.0), SessionCreated)[0].resume_token
    for i in range(20):
        m2.handle(speaking(m2, "x"), i * 0.08)
    m2.handle(EventAck(0), 1.9)
    m2.handle(ConnectionDetached(1), 2.0)
    effects = m2.handle(ConnectionAttached(2, SessionResume(m2.session_id, token, 0)), 3.0)
    assert of(effects, SessionResyncRequired)[0].reason == "journal_overflow"
    assert m2.state is SessionState.ACTIVE


def test_event_ack_trims_and_rejects_future_seq():
    m = machine()
    for i in range(3):
        m.handle(speaking(m, "x"), i)
    m.handle(EventAck(2), 3.0)
    assert m.statistics().journal.first_seq == 3
    err = of(m.handle(EventAck(999, "a9"), 4.0), ErrorEvent)[0]
    assert (err.code, err.param, err.event_id) == ("bad_event", "server_event_seq", "a9")


def test_resume_of_a_closed_session_is_expired():
    m, created, _ = _created()
    m.handle(SessionClose(), 1.0)
    effects = m.handle(
        ConnectionAttached(2, SessionResume(m.session_id, created.resume_token)), 2.0
    )
    assert of(effects, ErrorEvent)[0].code == "session_resume_expired"
    assert of(effects, CloseConnection)[0].generation == 2
