"""Uploaded voices on disk: one mono PCM16 WAV and one JSON record a voice, in one folder.

The store is plain synchronous file work (the service calls it in a worker thread);
it validates everything a client sends before a byte is written:

- the name: `VOICE_NAME` (letters, digits, ``_`` and ``-``; no dot, no slash, so no
  path trick reaches the file system), not a built-in voice's name, not taken;
- the sample: a RIFF/WAVE PCM file (8, 16, 24 or 32 bit, any channel count, mixed
  to mono here) at one of `SAMPLE_RATES`, within the store's byte and duration
  limits and at least `MIN_DURATION_S` long, not all silence;
- the count: at most ``max_voices`` voices.

A voice is written as ``<name>.json`` then ``<name>.wav``, each to a temporary
file renamed into place, so a crash leaves no half voice: a voice exists when its
WAV does (a WAV without a record is listed from the WAV alone). The folder is the
store: a restart lists what is there. Deletion removes the WAV first.

Readers of the folder (PersonaPlex's voice library) look voices up by name through
``duplex.models.uploaded_voice_path``, the one rule both sides share.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import wave
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, final

import numpy as np

from duplex.exceptions import ProtocolError
from duplex.models import UPLOADED_VOICE_NAME, uploaded_voice_path
from duplex.pcm import float_to_pcm16
from duplex.refusals import echo

__all__ = [
    "MIN_DURATION_S",
    "SAMPLE_RATES",
    "VOICE_NAME",
    "StoredVoice",
    "VoiceExists",
    "VoiceLimits",
    "VoiceNotFound",
    "VoiceProblem",
    "VoiceStore",
    "VoiceStoreFull",
]

VOICE_NAME: Final = UPLOADED_VOICE_NAME
"""An uploaded voice's name: no dot and no separator, so it is one file name in one folder."""
SAMPLE_RATES: Final = (16_000, 22_050, 24_000, 32_000, 44_100, 48_000)
"""Rates a sample may have: below 16 kHz a voice loses what makes it a voice."""
MIN_DURATION_S: Final = 0.5
_WIDTHS: Final = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2.0**31)}
MAX_REFERENCE_CHARS: Final = 4096


class VoiceProblem(ProtocolError):
    """A voice name, sample or reference text the store refuses (400, naming the field)."""

    code: ClassVar[str] = "invalid_value"


@final
class VoiceExists(ProtocolError):
    """The name is taken (by an uploaded voice, or a built-in one)."""

    code: ClassVar[str] = "voice_exists"
    status_hint: ClassVar[int] = 409


@final
class VoiceNotFound(ProtocolError):
    code: ClassVar[str] = "voice_not_found"
    status_hint: ClassVar[int] = 404


@final
class VoiceStoreFull(ProtocolError):
    """The store holds ``max_voices``: one more waits for a deletion."""

    code: ClassVar[str] = "voice_store_full"
    status_hint: ClassVar[int] = 409


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceLimits:
    """What one store accepts.

    Args:
        max_voices: voices kept at once; one more is refused until one is deleted.
        max_bytes: the largest sample file accepted.
        max_duration_s: the longest sample.
    """

    max_voices: int = 100
    max_bytes: int = 10 * 1024 * 1024
    max_duration_s: float = 30.0


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StoredVoice:
    """One uploaded voice as listed (its samples stay on disk)."""

    name: str
    created_at: int
    duration_s: float
    sample_rate: int
    reference_text: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The SDK's ``Voice`` object, with what this server adds."""
        return {
            "id": self.name,
            "object": "audio.voice",
            "name": self.name,
            "type": "audio_sample",
            "created_at": self.created_at,
            "duration_s": round(self.duration_s, 3),
            "sample_rate": self.sample_rate,
            "reference_text": self.reference_text,
            "uploaded": True,
        }


def check_name(name: str) -> str:
    """``name`` if it is a valid voice name.

    Raises:
        VoiceProblem: it is not (param ``name``).
    """
    if not VOICE_NAME.fullmatch(name):
        raise VoiceProblem(
            f"Voice name {echo(name)} is not valid: 1 to 64 letters, digits, '_' or '-', "
            "starting with a letter or digit.",
            param="name",
        )
    return name


def decode_sample(data: bytes, limits: VoiceLimits) -> tuple[np.ndarray, int]:
    """A sample file as mono int16 PCM and its rate.

    Raises:
        VoiceProblem: not a PCM WAV, a rate not in `SAMPLE_RATES`, too short, too long,
            silent (param ``audio_sample``).
    """
    param = "audio_sample"
    if len(data) > limits.max_bytes:
        raise VoiceProblem(
            f"The audio sample is {len(data)} bytes; the most is {limits.max_bytes}.",
            param=param,
        )
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise VoiceProblem("The audio sample is not a WAV file (RIFF/WAVE, PCM).", param=param)
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.getnframes()
            too_long = rate > 0 and frames / rate > limits.max_duration_s
            raw = b"" if too_long else wav.readframes(frames)
    except (EOFError, wave.Error) as exc:
        message = f"The audio sample is not a readable PCM WAV: {exc}"
        raise VoiceProblem(message, param=param) from None
    if too_long:
        raise VoiceProblem(
            f"The audio sample is {frames / rate:.1f} s long; the most is "
            f"{limits.max_duration_s:g} s.",
            param=param,
        )
    if rate not in SAMPLE_RATES:
        rates = ", ".join(str(r) for r in SAMPLE_RATES)
        raise VoiceProblem(
            f"The audio sample's rate is {rate} Hz; it must be one of {rates}.", param=param
        )
    if width == 3:  # 24-bit: widen each sample to 32 bits
        triples = np.frombuffer(raw[: len(raw) // 3 * 3], dtype=np.uint8).reshape(-1, 3)
        padded = np.zeros((triples.shape[0], 4), dtype=np.uint8)
        padded[:, 1:] = triples
        raw, width = padded.tobytes(), 4
    if width not in _WIDTHS or not 1 <= channels <= 8:
        raise VoiceProblem(
            f"The audio sample is {8 * width}-bit with {channels} channels; it must be 8, 16, "
            "24 or 32-bit PCM with 1 to 8 channels.",
            param=param,
        )
    dtype, offset, scale = _WIDTHS[width]
    usable = len(raw) // (width * channels) * width * channels
    samples = (np.frombuffer(raw[:usable], dtype=dtype).astype(np.float64) - offset) / scale
    mono = samples.reshape(-1, channels).mean(axis=1)
    duration = mono.size / rate
    if duration < MIN_DURATION_S:
        raise VoiceProblem(
            f"The audio sample is {duration:.2f} s long; it must be at least {MIN_DURATION_S} s.",
            param=param,
        )
    pcm = float_to_pcm16(mono)
    if not pcm.any():
        raise VoiceProblem("The audio sample is silent.", param=param)
    return pcm, rate


def _wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()


def _write_atomically(path: Path, data: bytes) -> None:
    handle, scratch = tempfile.mkstemp(prefix=".upload-", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


@final
class VoiceStore:
    """The uploaded voices of one folder (created if absent).

    Args:
        folder: where the voices live; it is the whole state (a restart lists it).
        limits: what one upload and the store may hold.
    """

    def __init__(self, folder: Path, limits: VoiceLimits | None = None) -> None:
        self.folder = folder
        self.limits = limits or VoiceLimits()

    def names(self) -> list[str]:
        """The stored voices' names, sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(
            path.stem for path in self.folder.glob("*.wav") if VOICE_NAME.fullmatch(path.stem)
        )

    def list(self) -> list[StoredVoice]:
        return [voice for name in self.names() if (voice := self.get(name)) is not None]

    def exists(self, name: str) -> bool:
        """``name`` is a stored voice (one stat)."""
        return uploaded_voice_path(self.folder, name) is not None

    def get(self, name: str) -> StoredVoice | None:
        """The voice ``name`` (``None``: none such, or not a voice name)."""
        path = uploaded_voice_path(self.folder, name)
        if path is None:
            return None
        record: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):  # else listed from its WAV alone
            record = json.loads((self.folder / f"{name}.json").read_text())
        try:
            with wave.open(str(path), "rb") as wav:
                rate, frames = wav.getframerate(), wav.getnframes()
        except (OSError, EOFError, wave.Error):
            return None  # vanished, or not ours: not a voice
        reference = record.get("reference_text")
        return StoredVoice(
            name=name,
            created_at=int(record.get("created_at") or path.stat().st_mtime),
            duration_s=frames / rate,
            sample_rate=rate,
            reference_text=reference if isinstance(reference, str) else None,
        )

    def add(
        self,
        name: str,
        sample: bytes,
        reference_text: str | None,
        created_at: int,
        reserved: Collection[str] = (),
    ) -> StoredVoice:
        """Validate and store one voice; ``reserved``: names that are not free (built-in
        voices), compared without case.

        Raises:
            VoiceProblem: a bad name or sample (400); `VoiceExists` (409) for a taken or
                built-in name; `VoiceStoreFull` (409) at ``max_voices``.
        """
        check_name(name)
        if name.lower() in {other.lower() for other in reserved}:
            raise VoiceExists(f"{name!r} is a built-in voice's name.", param="name")
        if reference_text is not None and len(reference_text) > MAX_REFERENCE_CHARS:
            raise VoiceProblem(
                f"reference_text is {len(reference_text)} characters; the most is "
                f"{MAX_REFERENCE_CHARS}.",
                param="reference_text",
            )
        pcm, rate = decode_sample(sample, self.limits)
        taken = self.names()
        if any(other.lower() == name.lower() for other in taken):
            raise VoiceExists(f"A voice named {name!r} exists; delete it first.", param="name")
        if len(taken) >= self.limits.max_voices:
            raise VoiceStoreFull(
                f"The store holds its most voices ({self.limits.max_voices}); delete one first.",
                param="name",
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"name": name, "created_at": created_at, "reference_text": reference_text}
        _write_atomically(self.folder / f"{name}.json", json.dumps(record).encode())
        _write_atomically(self.folder / f"{name}.wav", _wav_bytes(pcm, rate))
        return StoredVoice(
            name=name,
            created_at=created_at,
            duration_s=pcm.size / rate,
            sample_rate=rate,
            reference_text=reference_text,
        )

    def delete(self, name: str) -> None:
        """Remove voice ``name``.

        Raises:
            VoiceNotFound: no such voice (404).
        """
        path = uploaded_voice_path(self.folder, name)
        if path is None:
            raise VoiceNotFound(f"No uploaded voice {echo(name)}.", param="voice_id")
        path.unlink(missing_ok=True)
        (self.folder / f"{name}.json").unlink(missing_ok=True)
