"""Playback acks and history; the video lane; admission."""

from duplex.sessions import (
    CLOSE_TRY_AGAIN_LATER,
    Admission,
    AudioCommit,
    Capabilities,
    CloseConnection,
    ErrorEvent,
    ModelAppendVideo,
    ModelFrame,
    PlaybackAck,
    PlaybackAcknowledged,
    ResponseCreated,
    VideoAppend,
    VideoConsumed,
)

from .sessionkit import listening, machine, of, silence, speaking


def _spoken(m, frames=5, text="w"):
    rid = of(m.handle(speaking(m, text), 0.0), ResponseCreated)[0].response_id
    for _ in range(frames - 1):
        m.handle(speaking(m, text), 0.1)
    return rid


def test_ack_only_history_keeps_only_what_was_heard():
    m = machine(playback_commit_policy="ack_only")
    rid = _spoken(m, frames=5)  # 400 ms sent, "wwwww"
    m.handle(listening(m), 0.5)
    assert m.history == ()
    acked = of(m.handle(PlaybackAck(rid, 200), 0.6), PlaybackAcknowledged)[0]
    assert (acked.played_ms, acked.committed_ms, acked.sent_ms) == (200, 200, 400)
    assert acked.history_committed
    item = m.history[0]
    # Text marks whose audio starts before 200 ms: frames at 0, 80 and 160 ms.
    assert (item.role, item.audio_ms, item.text) == ("assistant", 200, "www")
    over = of(m.handle(PlaybackAck(rid, 10_000), 0.7), PlaybackAcknowledged)[0]
    assert over.played_ms == 400  # clamped to what was sent
    assert m.history[0].text == "wwwww"


def test_ack_after_a_newer_user_turn_is_too_late():
    m = machine(playback_commit_policy="ack_only", vad="external")
    rid = _spoken(m, frames=3)
    m.handle(silence(200), 0.3)
    m.handle(AudioCommit(), 0.4)  # a newer user item enters the history
    err = of(m.handle(PlaybackAck(rid, 100, None, "pa1"), 0.5), ErrorEvent)[0]
    assert (err.code, err.event_id) == ("playback_ack_too_late", "pa1")
    assert [h.role for h in m.history] == ["user"]


def test_commit_all_on_done_keeps_everything_and_acks_do_not_reorder():
    m = machine(playback_commit_policy="commit_all_on_done")
    rid = _spoken(m, frames=2, text="ab")
    m.handle(listening(m), 0.2)
    assert [(h.role, h.audio_ms, h.text) for h in m.history] == [("assistant", 160, "abab")]
    m.handle(silence(100), 0.3)
    m.handle(AudioCommit(), 0.4)
    acked = of(m.handle(PlaybackAck(rid, 80), 0.5), PlaybackAcknowledged)[0]
    assert acked.committed_ms == 160 and acked.played_ms == 80


def test_unknown_response_or_item_is_not_found():
    m = machine()
    rid = _spoken(m, frames=1)
    for ack, param in [
        (PlaybackAck("resp_nope", 1), "response_id"),
        (PlaybackAck(rid, 1, "item_other"), "item_id"),
    ]:
        err = of(m.handle(ack, 0.2), ErrorEvent)[0]
        assert (err.code, err.param) == ("playback_item_not_found", param)


def test_video_refused_without_capability():
    m = machine()
    err = of(m.handle(VideoAppend(b"jpg", "f1", 10, event_id="v1"), 0.0), ErrorEvent)[0]
    assert (err.code, err.event_id) == ("video_input_unsupported", "v1")


def test_video_forwarded_with_audio_clock_and_consumption_reported():
    m = machine(caps=Capabilities(supports_video_input=True))
    m.handle(silence(160), 0.0)
    frame = VideoAppend(bytes(2 * 2 * 3), "f7", 40, "rgb", 2, 2)
    fwd = of(m.handle(frame, 0.1), ModelAppendVideo)[0]
    assert fwd.frame is frame and fwd.audio_clock_ms == 160 and fwd.epoch == 0
    consumed = of(
        m.handle(ModelFrame(5, consumed_video_frame_ids=("f7",), latest_video_pts_ms=40), 0.2),
        VideoConsumed,
    )[0]  # an input fact: reported even from a stale-epoch frame
    assert consumed.frame_ids == ("f7",) and consumed.latest_pts_ms == 40


def test_admission_refuses_beyond_capacity_until_release():
    adm = Admission(capacity=1)
    assert adm.try_admit("a") and not adm.try_admit("b")
    effects = adm.refusal(9, "e1")
    err = of(effects, ErrorEvent)[0]
    assert (err.code, err.type, err.event_id) == ("resource_exhausted", "rate_limit_error", "e1")
    assert of(effects, CloseConnection) == [
        CloseConnection(9, CLOSE_TRY_AGAIN_LATER, "resource_exhausted")
    ]
    adm.release("a")
    assert adm.try_admit("b") and adm.statistics().refused == 1
