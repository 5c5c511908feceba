"""The client's sans-I/O parts: the resume cursor and the speaker timeline behind its acks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.client import Playout, ResumeRefused, ServerEvent, SessionCursor, realtime_url


def event(kind: str, seq: int | None = None, **fields: object) -> ServerEvent:
    return ServerEvent.parse(json.dumps({"type": kind, "server_event_seq": seq, **fields}))


def test_the_cursor_keeps_the_token_and_drops_replayed_duplicates() -> None:
    cursor = SessionCursor()
    with pytest.raises(ResumeRefused):
        cursor.resume_event()
    assert cursor.receive(event("session.created", session={"id": "s1"}, resume_token="t1"))
    assert cursor.receive(event("response.created", 1))
    assert cursor.receive(event("response.output_audio.delta", 2))
    assert cursor.resume_event() == {
        "type": "session.resume",
        "session_id": "s1",
        "resume_token": "t1",
        "last_received_server_event_seq": 2,
    }
    assert cursor.receive(event("session.resumed", resume_token="t2"))
    assert not cursor.receive(event("response.output_audio.delta", 2))  # replayed
    assert cursor.receive(event("response.done", 3))
    assert (cursor.resume_token, cursor.resumes, cursor.duplicates) == ("t2", 1, 1)
    assert cursor.receive(event("error"))  # connection-scoped: never a duplicate


def test_a_group_cut_short_is_not_delivered_twice() -> None:
    """``response.done`` has no seq: its group's last event (``rate_limits.updated``) has."""
    cursor = SessionCursor()
    cursor.receive(event("session.created", session={"id": "s1"}, resume_token="t1"))
    assert cursor.receive(event("response.output_audio.delta", 5))
    assert cursor.receive(event("response.output_audio.done"))
    assert cursor.receive(event("response.done"))
    # the socket drops here; the replay sends the whole group again, then what followed
    assert cursor.receive(event("session.resumed", resume_token="t2"))
    assert not cursor.receive(event("response.output_audio.done"))
    assert not cursor.receive(event("response.done"))
    assert cursor.receive(event("rate_limits.updated", 6))
    assert cursor.receive(event("response.output_audio.done"))  # a new group: delivered
    assert cursor.duplicates == 2


def test_event_acks_come_every_n_seqs() -> None:
    cursor = SessionCursor()
    for seq in range(1, 4):
        cursor.receive(event("x", seq))
    assert cursor.event_ack(4) is None
    cursor.receive(event("x", 4))
    assert cursor.event_ack(4) == {"type": "session.event_ack", "server_event_seq": 4}
    assert cursor.event_ack(4) is None
    assert cursor.event_ack(0) is None


@pytest.mark.parametrize("bad", ["[]", '{"type": 3}', "nope"])
def test_a_bad_frame_is_a_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        ServerEvent.parse(bad)


def test_realtime_urls() -> None:
    assert realtime_url("ws://h:1") == "ws://h:1/v1/realtime?duplex=1"
    assert realtime_url("ws://h:1/v1/realtime?model=m", resume=True) == (
        "ws://h:1/v1/realtime?model=m&duplex=1&resume=1"
    )
    assert realtime_url("ws://h:1/v1/realtime?resume=1") == "ws://h:1/v1/realtime?duplex=1"


def test_the_playout_plays_in_order_and_reports_what_played() -> None:
    playout = Playout()
    playout.add("a", 2400, now=0.0)  # 100 ms
    assert playout.add("a", 2400, now=0.05) == pytest.approx(0.1)  # queued after the first
    assert playout.played_ms("a", 0.0) == 0
    assert playout.played_ms("a", 0.05) == pytest.approx(50)
    assert playout.played_ms("a", 0.15) == pytest.approx(150)
    assert playout.played_ms("a", 9.0) == pytest.approx(200)
    assert playout.idle(0.2) and not playout.idle(0.19)


def test_a_stop_keeps_what_was_heard_and_drops_the_rest() -> None:
    playout = Playout()
    playout.add("a", 24_000, now=0.0)  # 1 s
    playout.stop(0.25)
    assert playout.played_ms("a", 5.0) == pytest.approx(250)
    assert playout.idle(0.25)
    assert playout.add("b", 2400, now=0.3) == pytest.approx(0.3)


@given(st.lists(st.tuples(st.integers(1, 5000), st.floats(0, 0.5)), min_size=1, max_size=20))
def test_played_never_exceeds_what_was_added_and_never_goes_back(
    chunks: list[tuple[int, float]],
) -> None:
    playout = Playout()
    now, total_ms, last = 0.0, 0.0, 0.0
    for samples, gap in chunks:
        now += gap
        playout.add("r", samples, now)
        total_ms += 1000 * samples / 24_000
        played = playout.played_ms("r", now)
        assert last - 1e-6 <= played <= total_ms + 1e-6
        last = played
    assert playout.played_ms("r", now + 1000) == pytest.approx(total_ms)
