"""The ``/api/chat`` and ``/v1/audio/duplex`` projections, without sockets.

The fuzz tests feed the projection what a broken or hostile peer could send (Kyutai's
own Ogg/Opus stream cut anywhere, truncated, bit-flipped, re-tagged, oversized, text
frames) and check that each frame ends in an event, nothing, or a ``ProtocolError``;
nothing else ever escapes, and an error the stream cannot survive carries a close.
"""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest
import sphn
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.exceptions import ProtocolError
from duplex.sessions import (
    AudioAppend,
    AudioDelta,
    Capabilities,
    ErrorEvent,
    SessionClose,
    SessionClosed,
    SessionConfig,
    SessionCreate,
    SessionCreated,
    SessionPrompt,
    SessionReady,
    SessionSampling,
    TranscriptDelta,
)
from duplex.wire._moshi import ChatQuery, MoshiProjection
from duplex.wire._pcm import FLUSH_MARGIN_S, PcmProjection
from duplex.wire._stream import Later, OutputClock

FRAME = 1920


def _tone(frames: int, hz: float = 440.0) -> np.ndarray:
    n = np.arange(frames * FRAME)
    return (0.3 * np.sin(2 * np.pi * hz * n / 24000)).astype(np.float32)


def _sphn_stream(frames: int) -> bytes:
    writer = sphn.OpusStreamWriter(24000)
    return b"".join(writer.append_pcm(_tone(1)) for _ in range(frames))


STREAM = _sphn_stream(6)


def _created() -> SessionCreated:
    return SessionCreated("s", SessionConfig(), Capabilities(), "tok", 1, 0)


def _handshaken(**kw) -> MoshiProjection:
    p = MoshiProjection(ChatQuery(), **kw)
    p.frames(_created(), None, 0.0)
    assert p.frames(SessionReady("s"), None, 0.0) == [b"\x00"]
    return p


def _feed(p: MoshiProjection, frames: list[bytes | str]) -> tuple[int, ProtocolError | None]:
    """Samples decoded, and the error that ended the stream (if any)."""
    samples = 0
    for frame in frames:
        try:
            got = p.parse(frame, 1.0)
        except ProtocolError as exc:
            return samples, exc
        if got is not None:
            assert isinstance(got, AudioAppend) and got.sample_rate == 24000
            samples += len(got.pcm)
    return samples, None


# ----------------------------------------------------------------------- the query


def test_the_query_maps_onto_session_options():
    query = ChatQuery.parse({"text_prompt": "Be brief.", "voice_prompt": "NATF0.pt"})
    options = query.options()
    assert options.prompt == SessionPrompt("Be brief.", "NATF0.pt")
    assert options.overlap_policy == "model" and options.announce_ready is True
    assert ChatQuery.parse({}).options().prompt is None
    assert ChatQuery.parse({"text_prompt": "", "voice_prompt": ""}).options().prompt is None


def test_the_web_clients_sampling_parameters_become_the_sessions_sampling():
    web = {
        "text_temperature": "0.7",
        "text_topk": "25",
        "audio_temperature": "0.8",
        "audio_topk": "250",
        "pad_mult": "0",
        "text_seed": "1234",
        "audio_seed": "-5",
        "repetition_penalty_context": "64",
        "repetition_penalty": "1.0",
        "worker_auth_id": "ignored",
        "email": "ignored",
    }
    options = ChatQuery.parse(web).options()
    assert options.sampling == SessionSampling(
        text_temperature=0.7,
        text_top_k=25,
        audio_temperature=0.8,
        audio_top_k=250,
        text_seed=1234,
        audio_seed=-5,
        repetition_penalty=1.0,
        repetition_penalty_context=64,
        pad_mult=0.0,
    )
    assert ChatQuery.parse({"text_topk": "3"}).options().sampling == SessionSampling(text_top_k=3)
    assert ChatQuery.parse({"text_topk": ""}).options().sampling is None
    for name, bad in [
        ("text_topk", "2.5"),
        ("text_temperature", "-1"),
        ("audio_temperature", "nan"),
        ("audio_temperature", "1e400"),
        ("audio_topk", "1000001"),  # the session's range, named as the client did
        ("repetition_penalty", "0"),
        ("text_seed", "x"),
        ("audio_seed", str(2**64)),
    ]:
        with pytest.raises(ProtocolError) as caught:
            ChatQuery.parse({name: bad})
        assert caught.value.param == name and caught.value.close == (1008, "bad_event")
        assert name in caught.value.message and "session.sampling" not in caught.value.message


# ----------------------------------------------------------------------- inbound


def test_audio_before_the_handshake_is_decoded_and_dropped():
    p = MoshiProjection(ChatQuery())
    half = len(STREAM) // 2
    assert p.parse(b"\x01" + STREAM[:half], 0.0) is None
    p.frames(SessionReady("s"), None, 0.1)
    got = p.parse(b"\x01" + STREAM[half:], 0.2)  # the same Ogg stream goes on
    assert isinstance(got, AudioAppend)
    assert p.stats.dropped_before_handshake_samples + len(got.pcm) == 6 * FRAME - FRAME


def test_pages_split_anywhere_give_every_sample():
    p = _handshaken()
    cuts = [0, 1, 5, 27, 28, 100, 333, len(STREAM)]
    frames = [b"\x01" + STREAM[a:b] for a, b in pairwise(cuts)]
    samples, error = _feed(p, frames)
    assert error is None
    assert samples == 6 * FRAME - FRAME  # sphn's pre-skip of 3,840 at 48 kHz is dropped


def test_ignored_kinds_are_counted_not_refused():
    p = _handshaken()
    for frame in (b"\x03\x00", b"\x03\x03", b"\x04{}", b"\x06"):
        assert p.parse(frame, 0.0) is None
    assert p.stats.ignored_frames == 4 and not p.failed


@pytest.mark.parametrize(
    ("frame", "code", "close"),
    [
        ("text", "binary_frame_unsupported", 1003),
        (b"", "bad_event", 1008),
        (b"\x00", "unknown_event", 1003),
        (b"\x02hi", "unknown_event", 1003),
        (b"\xff", "unknown_event", 1003),
        (b"\x01" + b"x" * 40, "bad_audio", 1007),
        (b"\x01" + b"y" * 2000, "event_too_large", 1009),
    ],
)
def test_bad_frames_are_errors_that_close(frame, code, close):
    p = _handshaken(max_size=1000)
    with pytest.raises(ProtocolError) as caught:
        p.parse(frame, 0.0)
    assert caught.value.code == code and caught.value.close == (close, code)
    assert p.failed


def test_a_bad_crc_kills_the_stream():
    p = _handshaken()
    broken = bytearray(STREAM)
    broken[22] ^= 0xFF  # the first page's CRC field
    _, error = _feed(p, [b"\x01" + bytes(broken)])
    assert error is not None and error.code == "bad_audio" and p.failed


@settings(max_examples=300, deadline=None)
@given(
    cuts=st.lists(st.integers(0, len(STREAM)), max_size=8),
    flips=st.lists(st.tuples(st.integers(0, len(STREAM) - 1), st.integers(1, 255)), max_size=3),
    truncate=st.none() | st.integers(0, len(STREAM)),
    kinds=st.lists(st.integers(0, 255), max_size=4),
    extra=st.lists(st.binary(max_size=64) | st.text(max_size=8), max_size=3),
)
def test_fuzz_every_frame_ends_in_an_event_nothing_or_a_typed_error(
    cuts, flips, truncate, kinds, extra
):
    data = bytearray(STREAM if truncate is None else STREAM[:truncate])
    for at, mask in flips:
        if at < len(data):
            data[at] ^= mask
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    frames: list[bytes | str] = [b"\x01" + bytes(data[a:b]) for a, b in pairwise(bounds)]
    frames += [bytes([k]) + b"payload" for k in kinds]
    frames += extra
    p = _handshaken(max_size=4096)
    samples, error = _feed(p, frames)
    assert samples >= 0
    if error is not None:
        assert error.close is not None and error.close[0] in (1003, 1007, 1008, 1009)
        assert p.failed
    else:
        assert not p.failed
    if not flips and truncate is None and error is None:
        assert samples == 6 * FRAME - FRAME


# ---------------------------------------------------------------------- outbound


def test_a_model_frame_becomes_its_pages_at_once_and_sphn_decodes_them():
    p = _handshaken()
    reader = sphn.OpusStreamReader(24000)
    pcm16 = (_tone(3) * 32767).astype("<i2").tobytes()
    total = 0
    for i in range(3):
        chunk = pcm16[i * 2 * FRAME : (i + 1) * 2 * FRAME]
        (frame,) = p.frames(AudioDelta("r", "i", 0, chunk, 24000, 0.0), 1, 0.1)
        assert frame[0] == 1
        total += len(reader.append_bytes(frame[1:]))
    assert total == 3 * FRAME  # sphn ignores pre-skip: every sample, none held back


def test_partial_packets_wait_for_the_next_audio():
    p = _handshaken()
    assert p.frames(AudioDelta("r", "i", 0, bytes(2 * 500), 24000, 0.0), 1, 0.0) == []
    (frame,) = p.frames(AudioDelta("r", "i", 0, bytes(2 * 1420), 24000, 0.0), 1, 0.0)
    assert frame[0] == 1 and p.clock.sent_samples == 1920


def test_text_errors_and_quiet_events():
    p = _handshaken()
    assert p.frames(TranscriptDelta("r", "i", 0, " héllo", 0.0), 2, 0.0) == [b"\x02 h\xc3\xa9llo"]
    assert p.frames(TranscriptDelta("r", "i", 0, "", 0.0), 2, 0.0) == []
    error = ErrorEvent("input_backpressure", "rate_limit_error", "too fast")
    assert p.frames(error, None, 0.0) == [b"\x05input_backpressure: too fast"]
    assert p.left() == SessionClose()
    assert p.frames(SessionClosed("s", "client_close"), 3, 0.0) == []
    assert p.left() is None  # closed by the session: nothing to tell


def test_silence_keeps_the_stream_at_real_time():
    p = MoshiProjection(ChatQuery())
    assert p.due(5.0) == []  # nothing before the handshake
    p.frames(SessionReady("s"), None, 10.0)
    assert p.due(10.1) == []  # within the clock's slack
    reader = sphn.OpusStreamReader(24000)
    decoded = sum(len(reader.append_bytes(f[1:])) for f in p.due(10.4))
    assert decoded == 3 * FRAME  # 400 ms less the 160 ms slack
    pcm16 = bytes(2 * FRAME)
    p.frames(AudioDelta("r", "i", 0, pcm16, 24000, 0.0), 1, 10.45)  # the model's own frame
    assert p.due(10.48) == []  # it counts: nothing owed
    assert p.stats.silence_samples == 3 * FRAME


def test_the_clock_skips_a_stall_instead_of_bursting():
    clock = OutputClock(24000, FRAME, max_fill_s=0.5)
    clock.start(0.0)
    assert clock.owed_frames(10.0) == 1  # one frame now, not ten seconds of them
    assert clock.skipped_samples > 9 * 24000
    clock.sent(FRAME)
    assert clock.owed_frames(10.0) == 0
    assert clock.owed_frames(10.08) == 1  # and real time from there


# -------------------------------------------------------------- /v1/audio/duplex


def test_raw_open_audio_close_and_the_drain_estimate():
    p = PcmProjection()
    opened = p.parse(json.dumps({"type": "open", "persona": "Be kind.", "voice": "v"}), 0.0)
    assert isinstance(opened, SessionCreate)
    assert opened.options.prompt == SessionPrompt("Be kind.", "v")
    p.frames(_created(), None, 0.0)
    assert p.frames(SessionReady("s"), None, 1.0) == ['{"type":"ready"}']
    got = p.parse(_tone(25).astype("<f4").tobytes(), 1.1)  # 2 s sent at once
    assert isinstance(got, AudioAppend) and len(got.pcm) == 25 * FRAME
    later = p.parse(json.dumps({"type": "close"}), 1.2)
    assert isinstance(later, Later) and isinstance(later.event, SessionClose)
    assert later.at == pytest.approx(1.0 + 2.0 + FLUSH_MARGIN_S)
    assert p.frames(SessionClosed("s", "client_close"), 9, 3.5) == ['{"type":"done"}']


def test_raw_output_is_float32_and_text_is_json():
    p = PcmProjection()
    pcm16 = np.array([0, 16384, -32768], dtype="<i2").tobytes()
    (frame,) = p.frames(AudioDelta("r", "i", 0, pcm16, 24000, 0.0), 1, 0.0)
    assert np.frombuffer(frame, "<f4").tolist() == [0.0, 0.5, -1.0]
    assert p.frames(TranscriptDelta("r", "i", 0, "hi", 0.0), 2, 0.0) == [
        '{"type":"text","text":"hi"}'
    ]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_raw_fuzz_every_frame_is_an_event_nothing_or_a_typed_error(frame):
    p = PcmProjection(max_size=48)
    try:
        p.parse(frame, 0.0)
    except ProtocolError as exc:
        assert exc.close is None  # no stream state to break: the session goes on
    assert not p.failed
