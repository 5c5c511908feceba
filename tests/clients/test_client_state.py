"""The client's sans-I/O parts: the resume cursor and the jitter buffer behind its acks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.client import JitterBuffer, ResumeRefused, ServerEvent, SessionCursor, realtime_url


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


def pcm(n: int, value: int = 1) -> np.ndarray:
    return np.full(n, value, np.int16)


def test_a_response_waits_for_its_preroll_then_plays_in_order() -> None:
    jitter = JitterBuffer(preroll=100)
    jitter.add("a", pcm(60, 1))
    assert not jitter.pull(40).any()  # 60 < 100 buffered: silence, no underrun
    jitter.add("a", pcm(60, 2))
    block = jitter.pull(80)
    assert block.tolist() == [1] * 60 + [2] * 20
    assert jitter.handed == {"a": 80} and jitter.depth() == 40
    assert jitter.played("a", pending=0) == 80
    assert jitter.played("a", pending=30) == 50  # the device still holds its last 30
    assert jitter.played("a", pending=500) == 0  # everything handed is still in the device


def test_an_ended_response_starts_at_once_and_a_dry_one_is_an_underrun() -> None:
    jitter = JitterBuffer(preroll=100)
    jitter.add("a", pcm(10))
    jitter.end("a")
    assert jitter.pull(20).tolist() == [1] * 10 + [0] * 10
    assert jitter.underruns == 0  # it had ended: running out is its end
    jitter.add("b", pcm(150))
    jitter.pull(200)
    assert jitter.underruns == 1  # b ran dry mid-response
    jitter.add("b", pcm(50))
    assert not jitter.pull(10).any()  # and waits for its preroll again


def test_a_stop_drops_what_was_not_handed_to_the_device() -> None:
    jitter = JitterBuffer(preroll=0)
    jitter.add("a", pcm(100))
    jitter.pull(30)
    jitter.stop()
    assert jitter.dropped == 70 and jitter.depth() == 0
    assert jitter.played("a", pending=10) == 20
    jitter.add("b", pcm(5, 7))
    assert jitter.pull(5).tolist() == [7] * 5


def test_a_bad_preroll_or_history_is_refused() -> None:
    with pytest.raises(ValueError):
        JitterBuffer(preroll=-1)
    with pytest.raises(ValueError):
        JitterBuffer(history=0)


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 500), st.integers(1, 300)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 400),
    st.integers(0, 300),
)
def test_played_never_exceeds_what_was_added_nor_goes_back(
    steps: list[tuple[str, int, int]], pending: int, preroll: int
) -> None:
    jitter = JitterBuffer(preroll=preroll, history=1000)
    added: dict[str, int] = {}
    last: dict[str, int] = {}
    handed_total = 0
    for rid, samples, block in steps:
        jitter.add(rid, pcm(samples))
        added[rid] = added.get(rid, 0) + samples
        out = jitter.pull(block)
        handed_total += int(out.sum())  # every queued sample is 1, silence 0
        assert sum(jitter.handed.values()) == handed_total
        for r in added:
            played = jitter.played(r, pending)
            assert 0 <= played <= jitter.handed.get(r, 0) <= added[r]
            assert played >= last.get(r, 0)  # the device's latency is constant
            last[r] = played
    assert jitter.depth() + handed_total == sum(added.values())
