"""Where ``duplex talk``'s audio comes from and where the agent's goes: a WAV file, or the
sound device (PortAudio, through ``sounddevice``).

The conversation (``_talk.py``) sees only an `AudioSource` (80 ms chunks of PCM16 at
24 kHz) and an `AudioSink` (blocks of the same, written at the pace of a speaker). The
file pair and the device pair differ in nothing else: both run through the same pacing,
`JitterBuffer`, acks and transcript. Device audio is captured and played at the device's
own rate and resampled with `duplex.resample.StreamingResampler`.

Device reads and writes are PortAudio's blocking calls, each on a worker thread: a
live device paces them itself, and the conversation never sends faster than real
time, so a device that does not pace (ALSA's ``null``/``file`` plugins, which the
tests use as a microphone fed from a file) behaves like one that does.
"""

from __future__ import annotations

import wave
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, final

import numpy as np
import trio

from duplex.pcm import float_to_pcm16, pcm16_to_float
from duplex.resample import StreamingResampler, resample_pcm16

from ._state import SAMPLE_RATE

CHUNK = SAMPLE_RATE * 80 // 1000
"""Samples per append: 80 ms, a model frame."""


class AudioSource(Protocol):
    """The user's side: ``read`` returns the next `CHUNK` samples (int16, 24 kHz)."""

    @property
    def exhausted(self) -> bool:
        """What follows is silence (a file that ended); a microphone never is."""

    async def read(self) -> np.ndarray: ...


class AudioSink(Protocol):
    """The speaker: ``write`` blocks of int16 at 24 kHz, returning once the device took them."""

    @property
    def latency(self) -> int:
        """Samples written but not heard yet (the device's output latency)."""

    async def write(self, pcm: np.ndarray) -> None: ...


class InputStream(Protocol):
    """What `Microphone` needs of a blocking-mode, mono, int16 ``sounddevice.InputStream``."""

    samplerate: float

    def read(self, frames: int) -> tuple[np.ndarray, bool]: ...


class OutputStream(Protocol):
    """What `Speaker` needs of a blocking-mode, mono, int16 ``sounddevice.OutputStream``."""

    samplerate: float
    latency: float

    def write(self, data: np.ndarray) -> bool: ...


class NoSoundDevice(Exception):
    """No microphone or speaker can be opened here (no ``sounddevice``, PortAudio or device)."""


def read_wav(path: str | Path) -> np.ndarray:
    """A 16-bit PCM WAV as mono int16 at 24 kHz (channels averaged, resampled).

    Raises:
        ValueError: not 16-bit PCM.
    """
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV files are read")
        channels, rate = wav.getnchannels(), wav.getframerate()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    audio = samples.reshape(-1, channels).mean(axis=1)
    return resample_clip(np.clip(np.round(audio), -32768, 32767).astype(np.int16), rate)


def resample_clip(pcm: np.ndarray, rate: int, out_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A whole int16 clip from ``rate`` to ``out_rate`` (`duplex.resample.resample_pcm16`)."""
    return resample_pcm16(np.asarray(pcm, np.int16), rate, out_rate)


def write_wav(path: str | Path, pcm: np.ndarray) -> None:
    """A 24 kHz mono 16-bit WAV."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(pcm.astype("<i2").tobytes())


@final
@dataclass
class WavSource:
    """A clip said as a microphone would: 80 ms at a time, then silence."""

    speech: np.ndarray
    position: int = 0

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.speech)

    async def read(self) -> np.ndarray:
        await trio.lowlevel.checkpoint()
        chunk = self.speech[self.position : self.position + CHUNK]
        self.position += CHUNK
        if len(chunk) < CHUNK:
            chunk = np.concatenate([chunk, np.zeros(CHUNK - len(chunk), np.int16)])
        return chunk.astype(np.int16)


@final
@dataclass
class Recording:
    """A speaker that writes what it plays to memory (``--out``): as long as the conversation."""

    blocks: list[np.ndarray] = field(default_factory=list)
    latency: int = 0

    async def write(self, pcm: np.ndarray) -> None:
        await trio.lowlevel.checkpoint()
        self.blocks.append(np.asarray(pcm, np.int16).copy())

    def audio(self) -> np.ndarray:
        return np.concatenate(self.blocks) if self.blocks else np.zeros(0, np.int16)


@final
class Microphone:
    """PortAudio capture at the device's rate, resampled to 24 kHz, read 80 ms at a time.

    Args:
        stream: an open, started input stream.
    """

    exhausted = False

    def __init__(self, stream: InputStream) -> None:
        self._stream = stream
        self.rate = int(stream.samplerate)
        self._resampler = StreamingResampler(self.rate, SAMPLE_RATE)
        self._block = max(1, round(self.rate * 0.08))
        self._buffer = np.zeros(0, np.int16)
        self.overflows = 0
        """Reads that found the device's buffer overrun (audio lost before we read it)."""

    async def read(self) -> np.ndarray:
        while len(self._buffer) < CHUNK:
            data, overflowed = await trio.to_thread.run_sync(self._stream.read, self._block)
            self.overflows += bool(overflowed)
            pcm = float_to_pcm16(self._resampler.process(pcm16_to_float(data[:, 0])))
            self._buffer = np.concatenate([self._buffer, pcm])
        chunk, self._buffer = self._buffer[:CHUNK], self._buffer[CHUNK:]
        return chunk


@final
class Speaker:
    """PortAudio playback at the device's rate, from 24 kHz blocks.

    Args:
        stream: an open, started output stream.
    """

    def __init__(self, stream: OutputStream) -> None:
        self._stream = stream
        self.rate = int(stream.samplerate)
        self._resampler = StreamingResampler(SAMPLE_RATE, self.rate)
        self.latency = round(float(stream.latency) * SAMPLE_RATE)
        self.underflows = 0
        """Writes after which the device had run dry (PortAudio's output underflow)."""

    async def write(self, pcm: np.ndarray) -> None:
        out = float_to_pcm16(self._resampler.process(pcm16_to_float(pcm)))
        if len(out):
            underflowed = await trio.to_thread.run_sync(self._stream.write, out.reshape(-1, 1))
            self.underflows += bool(underflowed)


def device_missing() -> str | None:
    """Why the sound device cannot be used here, or ``None`` when it can."""
    try:
        import sounddevice as sd  # type: ignore[import-not-found]
    except (ImportError, OSError) as exc:
        return f"the `sounddevice` package or the PortAudio library is missing ({exc})"
    for kind in ("input", "output"):
        try:
            sd.query_devices(kind=kind)
        except (sd.PortAudioError, ValueError) as exc:
            return f"no sound {kind} device ({exc})"
    return None


@contextmanager
def sound_device(device: str | None = None) -> Iterator[tuple[Microphone, Speaker]]:
    """The default (or ``device``, a PortAudio name or index) microphone and speaker, open
    and started at the device's own rate; closed on exit.

    Raises:
        NoSoundDevice: there is none, or it cannot be opened.
    """
    reason = device_missing()
    if reason is not None:
        raise NoSoundDevice(reason)
    import sounddevice as sd

    chosen: Any = int(device) if device is not None and device.isdigit() else device
    try:
        rates = [
            int(sd.query_devices(chosen, kind)["default_samplerate"])
            for kind in ("input", "output")
        ]
        mic = sd.InputStream(device=chosen, samplerate=rates[0], channels=1, dtype="int16")
    except (sd.PortAudioError, ValueError) as exc:
        raise NoSoundDevice(f"cannot open the microphone ({exc})") from exc
    with mic:
        try:
            out = sd.OutputStream(device=chosen, samplerate=rates[1], channels=1, dtype="int16")
        except (sd.PortAudioError, ValueError) as exc:
            raise NoSoundDevice(f"cannot open the speaker ({exc})") from exc
        with out:
            yield Microphone(mic), Speaker(out)
