"""Speech audio encoding: every response format decodes (PyAV) at the rate asked, streams too."""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np
import pytest

from duplex.codecs._audio_files import (
    AUDIO_FORMATS,
    AudioStream,
    encode_audio,
    resample_pcm16,
)

RATE = 22050


def chirp(seconds: float = 0.5, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * 32767 * np.sin(2 * np.pi * (200 + 400 * t) * t)).astype(np.int16)


def decoded(data: bytes) -> tuple[str, int, int]:
    with av.open(io.BytesIO(data)) as file:
        stream = file.streams.audio[0]
        samples = sum(frame.samples for frame in file.decode(stream))
        return stream.codec_context.name, stream.sample_rate, samples


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 44100, 48000])
def test_resampling_keeps_duration_and_pitch(rate: int) -> None:
    tone = (0.5 * 32767 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.int16)
    out = resample_pcm16(tone, RATE, rate)
    assert out.dtype == np.int16 and out.size == rate
    spectrum = np.abs(np.fft.rfft(out[rate // 10 : -rate // 10].astype(np.float64)))
    peak_hz = np.argmax(spectrum) * rate / (rate - 2 * (rate // 10))
    assert peak_hz == pytest.approx(440, abs=3)
    assert np.abs(out).max() == pytest.approx(0.5 * 32767, rel=0.05)


@pytest.mark.parametrize("fmt", [f for f in AUDIO_FORMATS if f != "pcm"])
@pytest.mark.parametrize("rate", [16000, 22050, 48000])
def test_every_format_decodes_at_its_rate(fmt: str, rate: int) -> None:
    pcm = resample_pcm16(chirp(), RATE, rate)
    codec, decoded_rate, samples = decoded(encode_audio(pcm, rate, fmt))
    expected_rate = 48000 if fmt == "opus" else rate  # Opus decodes at 48 kHz (sent at 24)
    assert decoded_rate == expected_rate
    assert codec == {"wav": "pcm_s16le", "flac": "flac", "mp3": "mp3float", "aac": "aac",
                     "opus": "opus"}[fmt]  # fmt: skip
    # lossy codecs pad to whole frames: at most 0.1 s more
    assert 0.5 <= samples / expected_rate <= 0.6


def test_wav_header_and_pcm_bytes() -> None:
    pcm = chirp()
    data = encode_audio(pcm, RATE, "wav")
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        assert w.readframes(w.getnframes()) == pcm.astype("<i2").tobytes()
    assert encode_audio(pcm, RATE, "pcm") == pcm.astype("<i2").tobytes()
    with pytest.raises(ValueError, match="unknown audio format"):
        encode_audio(pcm, RATE, "ogg")


def test_flac_is_lossless() -> None:
    pcm = chirp()
    with av.open(io.BytesIO(encode_audio(pcm, RATE, "flac"))) as file:
        frames = [f.to_ndarray().reshape(-1) for f in file.decode(file.streams.audio[0])]
    assert np.array_equal(np.concatenate(frames), pcm)


@pytest.mark.parametrize("fmt", ["pcm", "wav", "opus"])
def test_a_stream_in_pieces_is_one_playable_file(fmt: str) -> None:
    pcm = chirp(1.0)
    stream = AudioStream(fmt, RATE)
    data = b"".join(stream.chunk(part) for part in np.array_split(pcm, 7)) + stream.end()
    if fmt == "pcm":
        assert data == pcm.astype("<i2").tobytes()
        return
    if fmt == "wav":
        assert data[:4] == b"RIFF" and struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
        assert data[44:] == pcm.astype("<i2").tobytes()
    _, rate, samples = decoded(data)
    assert samples / rate == pytest.approx(1.0, abs=0.05)


def test_only_cuttable_formats_stream() -> None:
    with pytest.raises(ValueError, match="cannot be streamed"):
        AudioStream("flac", RATE)
