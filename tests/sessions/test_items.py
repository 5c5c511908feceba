"""Conversation items (create / retrieve / delete) and truncation onto the playback ledger."""

import numpy as np

from duplex.sessions import (
    AudioDelta,
    ErrorEvent,
    ItemAdded,
    ItemCreate,
    ItemDelete,
    ItemDeleted,
    ItemRetrieve,
    ItemRetrieved,
    ItemTruncate,
    ItemTruncated,
    ResponseCreate,
    ResponseDone,
    Tick,
    TranscriptDelta,
)

from .sessionkit import loud, machine, of, silence, speaking

TURN_BASED = {"turn_policy": "turn_based", "turn_detection": "none"}


def _error(effects) -> tuple[str, str | None, str | None]:
    (err,) = of(effects, ErrorEvent)
    return err.code, err.param, err.event_id


def test_create_places_items_and_announces_the_predecessor():
    m = machine()
    (first,) = of(m.handle(ItemCreate("user", "hello", item_id="u1"), 0.0), ItemAdded)
    assert first.previous_item_id is None and first.item.text == "hello"
    (second,) = of(m.handle(ItemCreate("assistant", "hi"), 0.1), ItemAdded)
    assert second.previous_item_id == "u1" and second.item.content == "text"
    (system,) = of(
        m.handle(ItemCreate("system", "be brief", previous_item_id="root"), 0.2), ItemAdded
    )
    assert system.previous_item_id is None
    (middle,) = of(m.handle(ItemCreate("user", "and", previous_item_id="u1"), 0.3), ItemAdded)
    assert middle.previous_item_id == "u1"
    ids = [i.item_id for i in m.history]
    assert ids == [system.item.item_id, "u1", middle.item.item_id, second.item.item_id]


def test_create_refusals():
    m = machine()
    m.handle(ItemCreate("user", "hello", item_id="u1"), 0.0)
    dup = m.handle(ItemCreate("user", "again", item_id="u1", event_id="e1"), 0.1)
    assert _error(dup) == ("bad_event", "item.id", "e1")
    missing = m.handle(ItemCreate("user", "x", previous_item_id="nope", event_id="e2"), 0.2)
    assert _error(missing) == ("item_not_found", "previous_item_id", "e2")
    assert [i.item_id for i in m.history] == ["u1"]


def test_retrieve_and_delete():
    m = machine()
    m.handle(ItemCreate("user", "hello", item_id="u1"), 0.0)
    (got,) = of(m.handle(ItemRetrieve("u1"), 0.1), ItemRetrieved)
    assert got.item == m.history[0]
    assert _error(m.handle(ItemRetrieve("zz", "e3"), 0.2)) == ("item_not_found", "item_id", "e3")
    assert of(m.handle(ItemDelete("u1"), 0.3), ItemDeleted) == [ItemDeleted("u1")]
    assert m.history == ()
    assert _error(m.handle(ItemDelete("u1", "e4"), 0.4)) == ("item_not_found", "item_id", "e4")


def test_a_user_audio_item_is_resampled_and_answered_by_the_responder():
    m = machine(**TURN_BASED)
    pcm = (0.3 * np.sin(np.arange(1280) * 0.3)).astype(np.float32)  # 160 ms at 8 kHz
    (added,) = of(m.handle(ItemCreate("user", None, pcm, 8000), 0.0), ItemAdded)
    assert added.item.audio_ms == 160.0 and added.item.content == "audio"
    effects = m.handle(ResponseCreate(), 0.1) + m.handle(Tick(), 0.2)
    audio = b"".join(d.pcm for d in of(effects, AudioDelta))
    assert len(audio) == 2 * 3840  # 160 ms at 24 kHz
    assert len(of(effects, ResponseDone)) == 1


def test_a_text_item_is_answered_with_its_text():
    m = machine(**TURN_BASED)
    m.handle(ItemCreate("user", "hello there"), 0.0)
    effects = m.handle(ResponseCreate(), 0.1)
    assert [d.delta for d in of(effects, TranscriptDelta)] == ["hello there"]
    (done,) = of(effects, ResponseDone)
    assert (done.status, done.transcript, done.audio_ms) == ("completed", "hello there", 0.0)
    assert (m.history[-1].role, m.history[-1].text) == ("assistant", "hello there")


def _answered(m, ms: int = 480):
    """A committed turn of ``ms`` and a completed echo response of the same length."""
    from duplex.sessions import AudioCommit

    m.handle(loud(ms), 0.0)
    m.handle(AudioCommit(), 0.0)
    effects = m.handle(ResponseCreate(), 1.0)
    for k in range(1, ms // 80 + 1):
        effects += m.handle(Tick(), 1.0 + k * 0.08)
    (done,) = of(effects, ResponseDone)
    return done


def test_truncate_keeps_what_was_heard():
    m = machine(**TURN_BASED)
    done = _answered(m)
    assert m.history[-1].audio_ms == 480.0 and m.history[-1].text == done.transcript
    effects = m.handle(ItemTruncate(done.item_id, 0, 200), 2.0)
    assert of(effects, ItemTruncated) == [ItemTruncated(done.item_id, 0, 200)]
    item = m.history[-1]
    assert (item.item_id, item.audio_ms, item.text) == (done.item_id, 200.0, "[0][80][160]")


def test_truncate_refusals():
    m = machine(**TURN_BASED)
    done = _answered(m)
    beyond = m.handle(ItemTruncate(done.item_id, 0, 481, "t1"), 2.0)
    assert _error(beyond) == ("audio_end_ms_out_of_range", "audio_end_ms", "t1")
    part = m.handle(ItemTruncate(done.item_id, 1, 100, "t2"), 2.0)
    assert _error(part) == ("bad_event", "content_index", "t2")
    user = m.history[0].item_id
    assert _error(m.handle(ItemTruncate(user, 0, 10, "t3"), 2.0))[0] == "item_not_found"
    assert m.history[-1].audio_ms == 480.0  # nothing changed


def test_truncating_the_playing_item_cancels_its_response():
    m = machine()
    m.handle(silence(80), 0.0)
    m.handle(speaking(m, "a"), 0.1)
    m.handle(speaking(m, "b"), 0.2)
    item_id = m.history[-1].item_id if m.history else None
    assert item_id is None  # commit_all_on_done: nothing in the history yet
    response_id = m.active_response_id
    effects = m.handle(ItemTruncate(f"item_{response_id}", 0, 80), 0.3)
    (done,) = of(effects, ResponseDone)
    assert (done.status, done.reason) == ("cancelled", "client_cancelled")
    assert of(effects, ItemTruncated)
    assert (m.history[-1].audio_ms, m.history[-1].text) == (80.0, "a")
    assert of(m.handle(speaking(m, "c", epoch=m.epoch - 1), 0.4), AudioDelta) == []


def test_a_deleted_assistant_item_stays_deleted():
    """Truncate must look at the history: a deleted item does not come back."""
    m = machine(**TURN_BASED)
    done = _answered(m)
    m.handle(ItemDelete(done.item_id), 2.0)
    effects = m.handle(ItemTruncate(done.item_id, 0, 100, "t1"), 2.1)
    assert _error(effects) == ("item_not_found", "item_id", "t1")
    assert done.item_id not in [i.item_id for i in m.history]


def test_a_deleted_item_refuses_playback_acks_under_ack_only():
    from duplex.sessions import PlaybackAck, PlaybackAcknowledged

    m = machine(playback_commit_policy="ack_only")
    m.handle(silence(80), 0.0)
    m.handle(speaking(m, "a"), 0.1)
    m.handle(speaking(m, "b"), 0.2)
    response_id = m.active_response_id
    assert of(m.handle(PlaybackAck(response_id, 80), 0.3), PlaybackAcknowledged)
    item_id = m.history[-1].item_id
    assert of(m.handle(ItemDelete(item_id), 0.4), ItemDeleted)
    effects = m.handle(PlaybackAck(response_id, 160, event_id="a2"), 0.5)
    assert _error(effects) == ("playback_item_not_found", "response_id", "a2")
    assert item_id not in [i.item_id for i in m.history]
    effects = m.handle(ItemTruncate(item_id, 0, 80, "t1"), 0.6)
    assert _error(effects) == ("item_not_found", "item_id", "t1")
    assert item_id not in [i.item_id for i in m.history]


def test_a_cancelled_assistant_item_reads_back_incomplete():
    """``conversation.item.retrieve`` agrees with ``response.output_item.done``."""
    m = machine()
    m.handle(silence(80), 0.0)
    m.handle(speaking(m, "a"), 0.1)
    response_id = m.active_response_id
    from duplex.sessions import ResponseCancel

    (done,) = of(m.handle(ResponseCancel(response_id), 0.2), ResponseDone)
    assert done.status == "cancelled"
    (got,) = of(m.handle(ItemRetrieve(done.item_id), 0.3), ItemRetrieved)
    assert got.item.status == "incomplete"
    completed = machine(**TURN_BASED)
    done = _answered(completed)
    (got,) = of(completed.handle(ItemRetrieve(done.item_id), 2.0), ItemRetrieved)
    assert got.item.status == "completed"


def test_an_acked_item_is_in_progress_until_its_response_ends():
    from duplex.sessions import PlaybackAck

    m = machine(playback_commit_policy="ack_only")
    m.handle(silence(80), 0.0)
    m.handle(speaking(m, "a"), 0.1)
    response_id = m.active_response_id
    m.handle(PlaybackAck(response_id, 80), 0.2)
    assert m.history[-1].status == "in_progress"
    m.handle(speaking(m, "b", end=True), 0.3)
    assert m.history[-1].status == "completed"
