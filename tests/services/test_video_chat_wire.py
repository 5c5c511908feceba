"""The live video chat protocol, sans I/O (``duplex.services.videochat``): each event
parsed or refused with a typed error, every bound held, and the state machine's
invariants under any sequence of events (hypothesis)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.services.videochat import (
    MAX_AUDIO_BYTES,
    MAX_FRAMES,
    Answer,
    AudioChunk,
    Frame,
    Prefill,
    Query,
    Send,
    State,
    VideoChat,
    parse_event,
    similarity,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
JPEG = b"\xff\xd8\xff" + b"\0" * 8


def _msg(**event: Any) -> str:
    return json.dumps(event)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _configured(**config: Any) -> VideoChat:
    chat = VideoChat()
    (sent,) = chat.receive(parse_event(_msg(type="session.config", **config)))
    assert isinstance(sent, Send) and sent.event["type"] == "session.updated"
    return chat


def _frame(chat: VideoChat, thumb: bytes = b"", **fields: Any) -> list[Any]:
    event = parse_event(_msg(type="video.frame", image=_b64(PNG), **fields))
    assert isinstance(event, Frame), event
    return chat.receive(Frame(event.image, event.frame_id, event.pts_ms, thumb))


def _error(action: object) -> str:
    assert isinstance(action, Send) and action.event["type"] == "error", action
    return str(action.event["error"]["code"])


def test_the_config_defaults_and_its_bounds() -> None:
    chat = _configured()
    c = chat.config
    assert (c.modalities, c.max_frames, c.use_audio_in_video) == (("text", "audio"), 50, True)
    assert (c.enable_frame_filter, c.frame_filter_threshold) == (True, 0.95)
    for bad in (
        {"max_frames": 0},
        {"max_frames": MAX_FRAMES + 1},
        {"modalities": ["audio"]},
        {"frame_filter_threshold": 1.5},
        {"use_audio_in_video": "yes"},
        {"colour": 1},
    ):
        assert _error(parse_event(_msg(type="session.config", **bad))) != ""
    assert _configured(max_frames=MAX_FRAMES).config.max_frames == MAX_FRAMES
    assert _error(chat.receive(parse_event(_msg(type="session.config")))[0]) == "already_configured"


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("{", "invalid_json"),
        (_msg(type="video.frame", image="!!!"), "invalid_base64"),
        (_msg(type="video.frame", image=_b64(b"GIF89a....")), "invalid_image"),
        (_msg(type="video.frame", image=_b64(JPEG), pts_ms="soon"), "invalid_type"),
        (_msg(type="audio.chunk", audio=_b64(b"\0\0\0")), "invalid_value"),
        (_msg(type="video.query"), "missing_required_parameter"),
        (_msg(type="video.seek"), "unknown_event"),
    ],
)
def test_bad_events_are_typed_errors(message: str, code: str) -> None:
    assert _error(parse_event(message)) == code


def test_nothing_before_the_config_and_no_query_without_frames() -> None:
    chat = VideoChat()
    assert _error(_frame(chat)[0]) == "not_configured"
    chat = _configured()
    assert _error(chat.receive(Query("what?"))[0]) == "no_frames"


def test_frames_prefill_as_they_arrive_coalesced_while_one_runs() -> None:
    chat = _configured(enable_frame_filter=False)
    (first,) = _frame(chat, frame_id="a", pts_ms=0)
    assert isinstance(first, Prefill) and [f.frame_id for f in first.frames] == ["a"]
    assert _frame(chat, frame_id="b", pts_ms=80) == []  # one prefill at a time
    assert _frame(chat, frame_id="c", pts_ms=160) == []
    (again,) = chat.prefill_done()
    assert isinstance(again, Prefill) and [f.frame_id for f in again.frames] == ["a", "b", "c"]
    assert chat.prefill_done() == []  # nothing new


def test_a_query_answers_over_the_frames_and_says_which_it_consumed() -> None:
    chat = _configured(enable_frame_filter=False)
    _frame(chat, pts_ms=0)
    chat.prefill_done()
    _frame(chat, pts_ms=80)
    chat.prefill_done()
    chat.receive(AudioChunk(b"\1\0" * 10))
    (answer,) = chat.receive(Query("what is it?"))
    assert isinstance(answer, Answer) and chat.state is State.ANSWERING
    assert answer.audio == b"\1\0" * 10 and chat.audio == bytearray()
    assert _error(chat.receive(Query("again?"))[0]) == "query_in_progress"
    assert _frame(chat, pts_ms=160) == []  # kept, prefilled once the answer is done
    consumed = chat.consumed(answer).event
    assert consumed == {
        "type": "video.frames.consumed",
        "frame_ids": ["0", "1"],
        "frames": 2,
        "latest_pts_ms": 80.0,
    }
    (prefill,) = chat.answer_done(answer)
    assert isinstance(prefill, Prefill) and len(prefill.frames) == 3


def test_past_max_frames_the_oldest_half_goes_with_a_warning() -> None:
    chat = _configured(max_frames=4, enable_frame_filter=False)
    for i in range(4):
        _frame(chat, frame_id=f"f{i}")
        chat.prefill_done()
    out = _frame(chat, frame_id="f4")
    warning = out[0]
    assert isinstance(warning, Send) and warning.event["type"] == "warning"
    assert warning.event["warning"]["frames"] == 2
    assert [f.frame_id for f in chat.frames] == ["f2", "f3", "f4"] and chat.evicted == 2


def test_near_duplicate_frames_are_skipped_and_the_filter_can_be_off() -> None:
    still, moved = bytes([100] * 64), bytes([200] * 64)
    chat = _configured()
    _frame(chat, still)
    chat.prefill_done()
    assert _frame(chat, still) == [] and chat.skipped == 1 and len(chat.frames) == 1
    _frame(chat, moved)
    assert len(chat.frames) == 2
    off = _configured(enable_frame_filter=False)
    _frame(off, still)
    _frame(off, still)
    assert len(off.frames) == 2 and off.skipped == 0
    assert similarity(still, still) == 1.0 and similarity(still, b"") == 0.0


def test_audio_overflow_is_an_error_the_buffer_cleared_and_it_recovers() -> None:
    chat = _configured()
    chunk = AudioChunk(b"\0" * (MAX_AUDIO_BYTES // 2))
    assert chat.receive(chunk) == [] and chat.receive(chunk) == []
    assert _error(chat.receive(AudioChunk(b"\0\0"))[0]) == "audio_buffer_overflow"
    assert len(chat.audio) == 0
    assert chat.receive(AudioChunk(b"\0\0")) == [] and len(chat.audio) == 2


_events = st.one_of(
    st.builds(lambda t: Frame(PNG, "", None, bytes([t]) * 4), st.integers(0, 255)),
    st.builds(
        lambda n: AudioChunk(b"\0" * n), st.integers(0, MAX_AUDIO_BYTES // 3).map(lambda n: n * 2)
    ),
    st.just(Query("q")),
    st.just("prefill_done"),
    st.just("answer_done"),
)


@settings(max_examples=300, deadline=None)
@given(
    max_frames=st.integers(1, 8), threshold=st.floats(0, 1), steps=st.lists(_events, max_size=60)
)
def test_any_sequence_keeps_every_bound(
    max_frames: int, threshold: float, steps: list[Any]
) -> None:
    chat = _configured(max_frames=max_frames, frame_filter_threshold=threshold)
    prefills = 0
    answering: Answer | None = None
    for step in steps:
        if step == "prefill_done":
            out = chat.prefill_done() if prefills else []
            prefills = 0
        elif step == "answer_done":
            out = chat.answer_done(answering) if answering is not None else []
            answering = None
        else:
            out = chat.receive(step)
        for action in out:
            if isinstance(action, Prefill):
                prefills += 1
                assert answering is None
            if isinstance(action, Answer):
                assert answering is None
                answering = action
        assert prefills <= 1  # never two prefills in flight
        assert len(chat.frames) <= max_frames
        assert len(chat.audio) <= MAX_AUDIO_BYTES
        assert (chat.state is State.ANSWERING) == (answering is not None)
