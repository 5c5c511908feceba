"""Ogg/Opus at 24 kHz against ``sphn`` 0.2.1, the codec of Kyutai's server and Python client.

Opus is lossy: audio is compared by correlation after aligning the codec delay, sample
counts exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import opuslib
import pytest
import sphn

from duplex.codecs._ogg import AudioPacket, EndOfStream, OggReader, OggWriter, OpusHead
from duplex.codecs._opus import (
    FRAME_SAMPLES,
    OggOpusDecoder,
    OggOpusEncoder,
    OpusDecodeError,
)
from duplex.pcm import float_to_pcm16

from .oggkit import lacing_of, raw_page

MODEL_FRAME = 1920  # Mimi: 80 ms at 24 kHz


def speechlike(frames: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """Two gliding tones with a slow envelope and a little noise: voice-band, not silence."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * MODEL_FRAME) / 24_000
    f = 220 + 80 * np.sin(2 * np.pi * 0.7 * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 24_000) + 0.1 * np.sin(2 * np.pi * 1250 * t)
    x *= 0.6 + 0.4 * np.sin(2 * np.pi * 2 * t)
    return (x + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def best_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 400) -> tuple[float, int]:
    """The highest normalised correlation of ``b`` shifted by -max_lag..max_lag against ``a``,
    and that shift (positive: ``b`` lags ``a``)."""
    best = (-1.0, 0)
    for lag in range(-max_lag, max_lag + 1):
        x, y = (a, b[lag:]) if lag >= 0 else (a[-lag:], b)
        n = min(len(x), len(y))
        c = float(np.corrcoef(x[:n], y[:n])[0, 1])
        best = max(best, (c, lag))
    return best


def sphn_stream(pcm: np.ndarray) -> list[bytes]:
    writer = sphn.OpusStreamWriter(24000)
    return [writer.append_pcm(pcm[i : i + MODEL_FRAME]) for i in range(0, len(pcm), MODEL_FRAME)]


def test_sphn_stream_decodes_to_exact_counts_and_the_same_audio() -> None:
    pcm = speechlike(25)
    messages = sphn_stream(pcm)
    reference = sphn.OpusStreamReader(24000)
    theirs = np.concatenate([reference.append_bytes(m) for m in messages])
    assert len(theirs) == len(pcm)  # sphn decodes every packet and trims nothing

    raw = OggOpusDecoder(trim_pre_skip=False)
    ours_raw = [raw.feed(m) for m in messages]
    assert [len(x) for x in ours_raw] == [MODEL_FRAME] * 25  # one model frame per message
    ours_raw = np.concatenate(ours_raw)
    # the same packets through the same codec: equal up to libopus build differences
    assert np.corrcoef(ours_raw, theirs)[0, 1] > 0.999

    trimmed = OggOpusDecoder()
    ours = np.concatenate([trimmed.feed(m) for m in messages])
    assert len(ours) == len(pcm) - 3840 // 2  # sphn's pre-skip: 3840 at 48 kHz
    np.testing.assert_array_equal(ours, ours_raw[1920:])


def test_our_stream_decodes_in_sphn_to_exact_counts_and_similar_audio() -> None:
    pcm = speechlike(25, seed=1)
    encoder = OggOpusEncoder(serial=7)
    messages = [encoder.encode(pcm[i : i + MODEL_FRAME]) for i in range(0, len(pcm), MODEL_FRAME)]
    reader = sphn.OpusStreamReader(24000)
    decoded = [reader.append_bytes(m) for m in messages]
    assert [len(x) for x in decoded] == [MODEL_FRAME] * 25  # no pre-skip trimmed by sphn
    corr, lag = best_correlation(pcm, np.concatenate(decoded))
    assert corr > 0.9, corr
    # the delay is what our OpusHead announces, give or take a few samples of phase
    assert abs(lag - encoder.head.pre_skip // 2) <= 8, lag


def test_our_round_trip_trims_exactly_the_pre_skip() -> None:
    pcm = speechlike(25, seed=2)
    encoder = OggOpusEncoder(serial=8)
    decoder = OggOpusDecoder()
    out = np.concatenate(
        [decoder.feed(encoder.encode(pcm[i : i + MODEL_FRAME])) for i in range(0, 48_000, 1920)]
    )
    skip = encoder.head.pre_skip // 2
    assert len(out) == len(pcm) - skip
    corr, lag = best_correlation(pcm, out, max_lag=50)
    assert corr > 0.9 and abs(lag) <= 8, (corr, lag)  # trimmed pre-skip: aligned with the input


def test_one_model_frame_is_two_pages_out_at_once() -> None:
    encoder = OggOpusEncoder(serial=9)
    pre_skip = encoder.head.pre_skip
    frames = [encoder.encode(x) for x in speechlike(3).reshape(3, MODEL_FRAME)]
    reader = OggReader()
    first = reader.feed(frames[0])
    assert isinstance(first[0], OpusHead) and first[0].input_sample_rate == 24_000
    assert [e.granule for e in first[2:]] == [pre_skip + 1920, pre_skip + 3840]
    for k, frame in enumerate(frames[1:], start=2):
        packets = reader.feed(frame)
        assert [e.granule for e in packets] == [pre_skip + 1920 * (2 * k - 1 + j) for j in (0, 1)]
    assert reader.statistics().pages == 2 + 6
    last = encoder.encode(np.zeros(MODEL_FRAME, np.float32), last=True)
    assert isinstance(reader.feed(last)[-1], EndOfStream)


def test_encoder_takes_int16_and_refuses_partial_packets() -> None:
    pcm = speechlike(2, seed=3)
    from_int = OggOpusEncoder(serial=1)
    decoded = OggOpusDecoder(trim_pre_skip=False).feed(from_int.encode(float_to_pcm16(pcm)))
    assert len(decoded) == len(pcm)
    assert best_correlation(pcm, decoded)[0] > 0.85
    encoder = OggOpusEncoder(serial=2)
    with pytest.raises(ValueError, match="multiple of 960"):
        encoder.encode(np.zeros(MODEL_FRAME + 480, np.float32))
    with pytest.raises(ValueError, match="float32 or int16"):
        encoder.encode(np.zeros(MODEL_FRAME, np.float64))
    with pytest.raises(ValueError):
        OggOpusEncoder(frame_samples=1000)
    assert FRAME_SAMPLES == 960


def test_web_client_framing_two_20ms_packets_per_page() -> None:
    """opus-recorder, as Moshi's web client sets it: 20 ms frames, at most two per page."""
    pcm = speechlike(5, seed=4)
    opus = opuslib.Encoder(24_000, 1, opuslib.APPLICATION_AUDIO)
    packets = [opus.encode_float(pcm[i : i + 480].tobytes(), 480) for i in range(0, len(pcm), 480)]
    head = OpusHead(pre_skip=opus.lookahead * 2, input_sample_rate=48_000)
    header_pages = OggWriter(serial=3, head=head).headers()
    pages = []
    for k in range(0, len(packets), 2):
        pair = packets[k : k + 2]
        lacing = [v for p in pair for v in lacing_of(len(p))]
        pages.append(raw_page(lacing, b"".join(pair), seq=2 + k // 2, serial=3, granule=0))
    decoder = OggOpusDecoder(trim_pre_skip=False)
    out = np.concatenate([decoder.feed(header_pages), *(decoder.feed(p) for p in pages)])
    assert len(out) == len(pcm)
    assert best_correlation(pcm, out)[0] > 0.9


def test_corrupt_opus_packet_is_a_typed_error() -> None:
    encoder = OggOpusEncoder(serial=4)
    stream = encoder.encode(np.zeros(MODEL_FRAME, np.float32))
    reader = OggReader()
    (_head, _tags, *packets) = reader.feed(stream)
    assert all(isinstance(p, AudioPacket) for p in packets)
    writer = OggWriter(serial=5, head=encoder.head)
    decoder = OggOpusDecoder()
    decoder.feed(writer.headers())
    with pytest.raises(OpusDecodeError) as info:
        decoder.feed(writer.write(b"\x03", 960))  # code 3 without its frame-count byte
    assert info.value.code == "bad_audio"


def test_stereo_stream_is_decoded_to_mono() -> None:
    """Mapping family 0 allows two channels; libopus downmixes them for a mono decoder."""
    opus = opuslib.Encoder(24_000, 2, opuslib.APPLICATION_VOIP)
    left = speechlike(2, seed=5)
    stereo = np.stack([left, left], axis=1).reshape(-1)  # interleaved L R
    writer = OggWriter(serial=6, head=OpusHead(channels=2, pre_skip=opus.lookahead * 2))
    stream = writer.headers() + b"".join(
        writer.write(opus.encode_float(stereo[i : i + 1920].tobytes(), 960), 1920)
        for i in range(0, len(stereo), 1920)
    )
    out = OggOpusDecoder(trim_pre_skip=False).feed(stream)
    assert len(out) == len(left)
    assert best_correlation(left, out)[0] > 0.85
