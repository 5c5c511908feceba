"""Speech audio on the wire: resampling to the asked rate, and the response formats.

Whole files (`encode_audio`): ``wav`` (the stdlib ``wave``), ``pcm`` (raw
s16le mono), ``opus`` (Ogg Opus at 24 kHz through this package's own
`OggOpusEncoder`, the one ``/api/chat`` uses), and ``flac``, ``mp3`` and
``aac`` (ADTS) through PyAV, whose wheels bundle FFmpeg's encoders.

Streams (`AudioStream`, for ``stream: true`` over HTTP): ``pcm``, ``wav`` (a
header whose sizes say "unknown", ``0xFFFFFFFF``, as streaming servers write
it) and ``opus`` (Ogg pages as they are made) can be cut anywhere and played
as they arrive; the other formats are refused for streaming.
"""

from __future__ import annotations

import io
import struct
import wave
from typing import Final, final

import numpy as np
import numpy.typing as npt

from duplex.resample import resample_pcm16 as resample_clip

from ._opus import FRAME_SAMPLES as OPUS_FRAME_SAMPLES
from ._opus import SAMPLE_RATE as OPUS_RATE
from ._opus import OggOpusEncoder

__all__ = [
    "AUDIO_FORMATS",
    "MEDIA_TYPES",
    "OPUS_RATE",
    "STREAM_FORMATS",
    "AudioStream",
    "encode_audio",
    "resample_pcm16",
]

Pcm16 = npt.NDArray[np.int16]

MEDIA_TYPES: Final[dict[str, str]] = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "aac": "audio/aac",
    "opus": "audio/opus",
}
"""``response_format`` -> ``Content-Type`` (OpenAI's)."""
AUDIO_FORMATS: Final[tuple[str, ...]] = tuple(MEDIA_TYPES)
STREAM_FORMATS: Final[tuple[str, ...]] = ("pcm", "wav", "opus")
"""Formats that can be sent as they are made (``stream: true``)."""

_AV: Final[dict[str, tuple[str, str]]] = {
    "flac": ("flac", "flac"),
    "mp3": ("mp3", "libmp3lame"),
    "aac": ("adts", "aac"),
}
"""PyAV's container and encoder of each format it writes."""


def resample_pcm16(pcm: Pcm16, in_rate: int, out_rate: int) -> Pcm16:
    """A whole speech clip at ``out_rate`` (16 taps a phase: speech needs no more)."""
    return resample_clip(pcm, in_rate, out_rate, taps_per_phase=16)


def _wav(pcm: Pcm16, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()


def _streaming_wav_header(rate: int) -> bytes:
    """A WAV header for a stream of unknown length (RIFF and data sizes ``0xFFFFFFFF``)."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
        + b"fmt " + struct.pack("<I", len(fmt)) + fmt
        + b"data" + struct.pack("<I", unknown)
    )  # fmt: skip


def _opus(pcm: Pcm16, rate: int) -> bytes:
    if rate != OPUS_RATE:
        pcm = resample_pcm16(pcm, rate, OPUS_RATE)
    pad = -pcm.size % OPUS_FRAME_SAMPLES or (OPUS_FRAME_SAMPLES if pcm.size == 0 else 0)
    pcm = np.concatenate([pcm, np.zeros(pad, np.int16)])
    return OggOpusEncoder().encode(pcm, last=True)


def _av(pcm: Pcm16, rate: int, fmt: str) -> bytes:
    import av

    container, codec = _AV[fmt]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame if pcm.size else None):
            file.mux(packet)
        if pcm.size:
            for packet in stream.encode(None):
                file.mux(packet)
    return out.getvalue()


def encode_audio(pcm: Pcm16, rate: int, fmt: str) -> bytes:
    """``pcm`` (mono int16 at ``rate``) as a whole file of ``fmt`` (one of `AUDIO_FORMATS`;
    ``opus`` is always 24 kHz: Opus has no 22.05 or 44.1 kHz mode)."""
    if fmt == "pcm":
        return pcm.astype("<i2").tobytes()
    if fmt == "wav":
        return _wav(pcm, rate)
    if fmt == "opus":
        return _opus(pcm, rate)
    if fmt in _AV:
        return _av(pcm, rate, fmt)
    raise ValueError(f"unknown audio format {fmt!r}")


@final
class AudioStream:
    """One streamed response of `STREAM_FORMATS`: `chunk` for each piece of PCM as it is
    made, `end` once; their bytes, concatenated, are one playable file.

    Args:
        fmt: ``pcm``, ``wav`` or ``opus``.
        rate: the PCM's rate (``opus``: resampled to 24 kHz per piece).
    """

    def __init__(self, fmt: str, rate: int) -> None:
        if fmt not in STREAM_FORMATS:
            raise ValueError(f"{fmt!r} cannot be streamed")
        self.fmt = fmt
        self.rate = rate
        self._started = False
        self._opus = OggOpusEncoder() if fmt == "opus" else None
        self._held = np.zeros(0, np.int16)  # opus: samples short of a whole packet

    def chunk(self, pcm: Pcm16) -> bytes:
        head = b""
        if not self._started:
            self._started = True
            head = _streaming_wav_header(self.rate) if self.fmt == "wav" else b""
        if self._opus is None:
            return head + pcm.astype("<i2").tobytes()
        if self.rate != OPUS_RATE:
            pcm = resample_pcm16(pcm, self.rate, OPUS_RATE)
        pcm = np.concatenate([self._held, pcm])
        whole = pcm.size - pcm.size % OPUS_FRAME_SAMPLES
        self._held = pcm[whole:]
        return self._opus.encode(pcm[:whole]) if whole else b""

    def end(self) -> bytes:
        if self._opus is None:
            return b"" if self._started else self.chunk(np.zeros(0, np.int16))
        pad = OPUS_FRAME_SAMPLES - self._held.size
        last = np.concatenate([self._held, np.zeros(pad, np.int16)])
        self._held = np.zeros(0, np.int16)
        return self._opus.encode(last, last=True)
