"""The native /v1/duplex JSON projection: parse errors, round trips, names, fuzz."""

import base64
import contextlib
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.exceptions import BadEvent, ProtocolError
from duplex.sessions import (
    SERVER_EVENT_TYPES,
    AudioAppend,
    AudioClear,
    AudioCommit,
    AudioDelta,
    Capabilities,
    ErrorEvent,
    EventAck,
    HistoryItem,
    OverlapDecision,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    ResponseDone,
    ResponseSettings,
    SessionClose,
    SessionConfig,
    SessionCreate,
    SessionCreated,
    SessionResume,
    SessionUpdate,
    TurnSignal,
    VideoAppend,
)
from duplex.wire import (
    CLIENT_EVENT_NAMES,
    SERVER_EVENT_NAMES,
    encode_server_event,
    parse_client_event,
)
from duplex.wire._json_text import dumps
from duplex.wire._native import NativeProjection, audio_delta_text
from duplex.wire._realtime import RealtimeProjection


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _code(text, **kw):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(text, **kw)
    return info.value.code, info.value.event_id, info.value.param


def test_client_event_names_match_the_issue():
    assert set(CLIENT_EVENT_NAMES) == {
        "session.create", "session.update", "input_audio_buffer.append",
        "input_audio_buffer.commit", "input_audio_buffer.clear", "turn.signal", "playback.ack",
        "response.create", "response.cancel", "session.resume", "session.event_ack",
        "session.close", "input_video.append",
    }  # fmt: skip


def test_append_pcm16_and_float32():
    pcm = np.array([0, 16384, -32768], dtype="<i2")
    ev = parse_client_event(json.dumps({
        "type": "input_audio_buffer.append", "event_id": "e1",
        "audio": _b64(pcm.tobytes()), "sample_rate": 16000,
    }))  # fmt: skip
    assert isinstance(ev, AudioAppend) and ev.sample_rate == 16000 and ev.event_id == "e1"
    np.testing.assert_allclose(ev.pcm, [0.0, 0.5, -1.0])
    f32 = np.array([0.25, -0.5], dtype="<f4")
    ev = parse_client_event(json.dumps({
        "type": "input_audio_buffer.append", "audio": _b64(f32.tobytes()), "format": "pcm_f32le",
    }))  # fmt: skip
    np.testing.assert_allclose(ev.pcm, [0.25, -0.5])
    assert ev.sample_rate is None


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("{nope", ("invalid_json", None, None)),
        ("[1, 2]", ("bad_event", None, None)),
        ('{"type": "nope", "event_id": "e2"}', ("unknown_event", "e2", "type")),
        ('{"event_id": "e3"}', ("bad_event", "e3", "type")),
        (
            '{"type": "playback.ack", "event_id": "e4", "response_id": "r"}',
            ("bad_event", "e4", "played_ms"),
        ),
        (
            '{"type": "playback.ack", "event_id": "e5", "response_id": 3, "played_ms": 1}',
            ("bad_event", "e5", "response_id"),
        ),
        (
            '{"type": "session.event_ack", "server_event_seq": true}',
            ("bad_event", None, "server_event_seq"),
        ),
        (
            '{"type": "input_audio_buffer.append", "event_id": "e6", "audio": "***"}',
            ("bad_audio", "e6", "audio"),
        ),
        (
            '{"type": "input_audio_buffer.append", "event_id": "e7", "audio": "AA=="}',
            ("bad_audio", "e7", "audio"),
        ),
        (
            '{"type": "input_audio_buffer.append", "event_id": "e8", "audio": "AAAA",'
            ' "sample_rate": 44100}',
            ("unsupported_audio_format", "e8", "sample_rate"),
        ),
        (
            '{"type": "input_audio_buffer.append", "audio": "AAAA", "format": "g711_ulaw"}',
            ("unsupported_audio_format", None, "format"),
        ),
        (
            '{"type": "session.update", "event_id": "e9", "session": {"overlap_policy": "x"}}',
            ("bad_event", "e9", "session.overlap_policy"),
        ),
        (
            '{"type": "session.update", "session": {"barge_in_ms": "1"}}',
            ("bad_event", None, "session.barge_in_ms"),
        ),
        ('{"type": "turn.signal", "event": "shout"}', ("bad_event", None, "event")),
        (
            '{"type": "input_video.append", "frame": "AAAA", "frame_id": "f", "pts_ms": 0,'
            ' "format": "rgb", "width": 2, "height": 2}',
            ("invalid_video_frames", None, "frame"),
        ),
        ('{"type": "session.close", "event_id": 5}', ("bad_event", None, "event_id")),
    ],
)
def test_bad_input_maps_to_one_typed_error(payload, expected):
    assert _code(payload) == expected


def test_size_and_binary_frames():
    big = json.dumps({"type": "session.close", "pad": "x" * 200})
    assert _code(big, max_size=100)[0] == "event_too_large"
    assert _code("é" * 60, max_size=100)[0] == "event_too_large"  # utf-8 bytes, not chars
    assert _code(b'{"type": "session.close"}')[0] == "binary_frame_unsupported"


def test_other_client_events():
    assert parse_client_event(
        '{"type": "session.resume", "session_id": "s", "resume_token": "t",'
        ' "last_received_server_event_seq": 7}'
    ) == SessionResume("s", "t", 7)
    assert parse_client_event(
        '{"type": "playback.ack", "response_id": "r", "played_ms": 12.7}'
    ) == (PlaybackAck("r", 12))
    assert parse_client_event('{"type": "session.event_ack", "server_event_seq": 3}') == EventAck(3)
    assert parse_client_event(
        '{"type": "turn.signal", "event": "barge_in", "payload": {"source": "client_vad"}}'
    ) == TurnSignal("barge_in", "client_vad")
    update = parse_client_event(
        '{"type": "session.update", "session": {"overlap_short_ack_ms": 500}}'
    )
    assert isinstance(update, SessionUpdate) and update.options.short_ack_ms == 500
    # an unknown session field is refused, never silently ignored
    with pytest.raises(BadEvent) as refused:
        parse_client_event('{"type": "session.update", "session": {"voice": "x"}}')
    assert refused.value.param == "session.voice"
    video = parse_client_event(json.dumps({
        "type": "input_video.append", "frame": _b64(bytes(12)), "frame_id": 4, "pts_ms": 80,
        "format": "rgb", "width": 2, "height": 2,
    }))  # fmt: skip
    assert isinstance(video, VideoAppend) and video.frame_id == "4" and len(video.frame) == 12


def test_encode_stamps_ids_and_seq():
    err = ErrorEvent("bad_event", "invalid_request_error", "nope", "e1", "x")
    out = encode_server_event(err, 5, random_bytes=lambda n: b"\x01" * n)
    assert out == {
        "type": "error",
        "event_id": "event_" + "01" * 12,
        "server_event_seq": 5,
        "error": {"type": "invalid_request_error", "code": "bad_event", "message": "nope",
                  "event_id": "e1", "param": "x"},
    }  # fmt: skip
    delta = encode_server_event(AudioDelta("r", "i", 2, b"\x01\x00", 24000, 0.0), 6)
    assert delta["type"] == "response.audio.delta" and delta["delta"] == "AQA="
    assert delta["sample_rate_hz"] == 24000 and delta["format"] == "pcm16"
    done = encode_server_event(ResponseDone("r", "i", 2, "cancelled", "barge_in", "hi", 80), 7)
    assert done["response"]["status_details"] == {"reason": "barge_in"}
    created = encode_server_event(
        SessionCreated("s", SessionConfig(), Capabilities(), "tok", 1, 0), None
    )
    caps = created["session"]["capabilities"]
    assert created["server_event_seq"] is None and caps["supports_session_resume"] is True
    assert json.loads(json.dumps(created)) == created
    assert encode_server_event(OverlapDecision("p", "drop", "backchannel", 1.0), 1)["type"] == (
        "overlap.decision"
    )


def _sample(cls):
    """One instance of a server event class with placeholder field values."""
    special = {
        "config": SessionConfig(),
        "capabilities": Capabilities(),
        "pcm": b"",
        "frame_ids": (),
        "status": "completed",
        "action": "drop",
        "item": HistoryItem("item_1", "user", 1, 80.0),
        "settings": ResponseSettings(),
        "calls": (),
    }
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name == "previous_item_id":
            continue
        numeric = "int" in str(f.type) or "float" in str(f.type)
        kwargs[f.name] = special.get(f.name, 0 if numeric else "x")
    return cls(**kwargs)


def test_every_server_event_has_its_issue_name():
    names = {encode_server_event(_sample(cls), 1)["type"] for cls in SERVER_EVENT_TYPES}
    assert names == set(SERVER_EVENT_NAMES)
    assert len(SERVER_EVENT_TYPES) == len(SERVER_EVENT_NAMES)


def _ids(n: int) -> bytes:
    return bytes(range(n))


@settings(max_examples=300, deadline=None)
@given(
    response_id=st.text(max_size=12),
    item_id=st.text(max_size=12),
    epoch=st.integers(min_value=0, max_value=2**64),
    pcm=st.binary(max_size=64).map(lambda b: b[: len(b) // 2 * 2]),
    rate=st.integers(min_value=1, max_value=192_000),
    start=st.floats() | st.integers(min_value=0, max_value=2**40),
    seq=st.none() | st.integers(min_value=1, max_value=2**64),
)
def test_audio_delta_template_writes_what_dumps_writes(
    response_id, item_id, epoch, pcm, rate, start, seq
):
    event = AudioDelta(response_id, item_id, epoch, pcm, rate, start)
    text = audio_delta_text(event, seq, random_bytes=_ids)
    assert text == dumps(encode_server_event(event, seq, random_bytes=_ids))


def test_native_frames_are_the_wire_events_as_json():
    projection = NativeProjection()
    delta = AudioDelta("resp_1", "item_1", 3, b"\x01\x00\xff\x7f", 24000, 160.0)
    err = ErrorEvent("bad_event", "invalid_request_error", "nope \u00e9", "e1", None)
    for event, seq in ((delta, 4), (err, None), (_sample(ResponseDone), 5)):
        (text,) = projection.frames(event, seq)
        wire = json.loads(text)
        assert wire.pop("event_id").startswith("event_")
        expected = encode_server_event(event, seq)
        del expected["event_id"]
        assert wire == expected
    assert projection.frames(delta, 4)[0].startswith('{"type":"response.audio.delta",')


EVENT_CLASSES = {
    "session.create": SessionCreate, "session.update": SessionUpdate,
    "input_audio_buffer.append": AudioAppend, "input_audio_buffer.commit": AudioCommit,
    "input_audio_buffer.clear": AudioClear, "turn.signal": TurnSignal,
    "playback.ack": PlaybackAck, "response.create": ResponseCreate,
    "response.cancel": ResponseCancel, "session.resume": SessionResume,
    "session.event_ack": EventAck, "session.close": SessionClose,
    "input_video.append": VideoAppend,
}  # fmt: skip


def test_every_client_event_name_has_its_class():
    assert set(EVENT_CLASSES) == set(CLIENT_EVENT_NAMES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_fuzz_arbitrary_frames_only_raise_protocol_errors(data):
    with contextlib.suppress(ProtocolError):  # anything else fails the test
        parse_client_event(data, max_size=150)


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(CLIENT_EVENT_NAMES),
    fields=st.dictionaries(
        st.sampled_from([
            "event_id", "session", "audio", "sample_rate", "format", "response_id", "played_ms",
            "item_id", "session_id", "resume_token", "last_received_server_event_seq",
            "server_event_seq", "event", "payload", "frame", "frame_id", "pts_ms", "width",
            "height",
        ]),
        json_values | st.sampled_from(["AAAA", "AQA=", "pcm_f32le", "rgb", 16000]),
        max_size=6,
    ),
)  # fmt: skip
def test_fuzz_structured_events_only_raise_protocol_errors(kind, fields):
    try:
        event = parse_client_event(json.dumps({"type": kind, **fields}))
    except ProtocolError as exc:
        assert exc.code and exc.message
        if isinstance(fields.get("event_id"), str):
            assert exc.event_id == fields["event_id"]
    else:
        assert type(event) is EVENT_CLASSES[kind]


def test_pcm16_round_trips_exactly_through_a_model_frame() -> None:
    from duplex.sessions import ModelFrame

    every = np.arange(-32768, 32768, dtype="<i2").tobytes()
    text = json.dumps({"type": "input_audio_buffer.append", "audio": _b64(every)})
    append = parse_client_event(text)
    assert ModelFrame(0, append.pcm).pcm == every


def test_session_modes_go_on_the_wire_as_plain_strings():
    """The config holds enum members; both wires write their names, as plain ``str``."""
    config = SessionConfig(overlap_policy="model", playback_commit_policy="ack_only")
    created = SessionCreated("duplex-abc", config, Capabilities(), "tok", 1, 0)
    native = encode_server_event(created, None)["session"]
    realtime = RealtimeProjection(duplex=True).encode(created, None)[0]["session"]
    for session in (native, realtime):
        for key, name in (("overlap_policy", "model"), ("playback_commit_policy", "ack_only")):
            assert type(session[key]) is str and session[key] == name
