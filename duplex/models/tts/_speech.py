"""What a speech runner takes and returns, and the contract it keeps.

A `SpeechRequest` is one text to speak; its runner splits it into sentences
(`split_sentences`) and calls ``gate.next_unit()`` between them, so a long
text is one request whose units let realtime work run in between. Streaming
callers (``WS /v1/audio/speech/stream``, the voice agent) send one request per
sentence instead, and get each sentence's audio as soon as it is made.

The runner shape is the request engine's ``BatchRunner`` (``name``,
``max_batch``, ``run_batch(requests, gate)``); `SpeechRunner` adds what the
HTTP surface needs to validate a request before queueing it (voices, rates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, final, runtime_checkable

import numpy as np
import numpy.typing as npt

from duplex.refusals import echo

from .._requests import UnitGate

__all__ = [
    "MAX_SPEED",
    "MIN_SPEED",
    "NO_GATE",
    "TTS_RUNNER",
    "SpeechAudio",
    "SpeechRequest",
    "SpeechRunner",
    "VoiceInfo",
    "speech_metadata",
    "voice_problem",
]

TTS_RUNNER = "tts"
"""The name a TTS runner is served under (``RequestEngines.get("tts")``, metrics' ``runner``)."""

MIN_SPEED = 0.25
MAX_SPEED = 4.0
"""OpenAI's ``speed`` range (1.0 is the voice's own pace)."""


@final
@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """One text to speak.

    Args:
        text: what to say (non-empty; the runner splits it into sentences).
        voice: a name from the runner's `SpeechRunner.voices` (OpenAI's names included).
        speed: pace relative to the voice's own, in [`MIN_SPEED`, `MAX_SPEED`].

    Audio comes back at the engine's own rate (`SpeechRunner.sample_rate`): the caller
    resamples, as for every model (the session layer owns the resampler, and models do
    not import sessions).
    """

    text: str
    voice: str = "alloy"
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise ValueError("text: must not be empty")
        if not (math.isfinite(self.speed) and MIN_SPEED <= self.speed <= MAX_SPEED):
            raise ValueError(f"speed: must be {MIN_SPEED}..{MAX_SPEED}, got {self.speed}")


@final
@dataclass(frozen=True, slots=True)
class SpeechAudio:
    """One request's speech: mono int16 PCM at ``sample_rate``."""

    pcm: npt.NDArray[np.int16] = field(repr=False)
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate


@final
@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """One voice a runner offers (``GET /v1/audio/voices``).

    Args:
        name: what a request's ``voice`` says.
        engine_voice: what the engine runs for it (an espeak ``lang+variant``, a speaker id).
        alias: the name is one of OpenAI's, mapped onto ``engine_voice``.
        language: its main language tag, when known.
    """

    name: str
    engine_voice: str
    alias: bool = False
    language: str | None = None


@final
class _NoGate:
    """A gate for direct calls: never waits, never cancels."""

    until = math.inf

    def next_unit(self, kind: str = "step") -> None:
        return None


NO_GATE: UnitGate = _NoGate()


def speech_metadata(
    model: str, sample_rate: int, voices: Sequence[VoiceInfo], variants: Sequence[str] = ()
) -> dict[str, Any]:
    """What a TTS runner tells the endpoints (``RequestEngine.metadata``), as plain data: it
    crosses the engine link when the engine runs in an engine process. ``model``: its name
    (``GET /v1/models`` lists it; a speech request's ``model`` names it)."""
    return {
        "model": model,
        "sample_rate": sample_rate,
        "voices": [
            {
                "name": v.name,
                "engine_voice": v.engine_voice,
                "alias": v.alias,
                "language": v.language,
            }
            for v in voices
        ],
        "variants": list(variants),
    }


def voice_problem(metadata: Mapping[str, Any], voice: str) -> str | None:
    """Why ``voice`` is not one the runner of ``metadata`` speaks (``None``: it is). A name
    from its voices, or, where it has variants, ``language+variant`` (``en-us+Andy``)."""
    names = [v["name"] for v in metadata.get("voices", ())]
    if voice in names:
        return None
    language, plus, variant = voice.partition("+")
    variants = metadata.get("variants", ())
    languages = {v["name"] for v in metadata.get("voices", ()) if not v["alias"]}
    if plus and variants and language in languages and variant in variants:
        return None
    aliases = [v["name"] for v in metadata.get("voices", ()) if v["alias"]]
    more = ", or language+variant" if variants else ""
    listed = ", ".join(aliases or names[:20])
    return f"unknown voice {echo(voice)}: use one of {listed}, or see GET /v1/audio/voices{more}"


@runtime_checkable
class SpeechRunner(Protocol):
    """A TTS engine as a request-batched runner.

    ``name`` is ``"tts"``; ``max_batch`` is the most requests one `run_batch` takes;
    ``sample_rate`` is the engine's own rate, the rate of every `SpeechAudio` it returns.
    """

    name: str
    max_batch: int
    sample_rate: int

    def voices(self) -> tuple[VoiceInfo, ...]:
        """Every voice a request may name, OpenAI's names first."""
        ...

    @property
    def metadata(self) -> Mapping[str, Any]:
        """`speech_metadata` of this runner."""
        ...

    def check_voice(self, voice: str) -> None:
        """Raise ``UnknownVoice`` (listing the valid names) unless ``voice`` is one."""
        ...

    def run_batch(
        self, requests: Sequence[SpeechRequest], gate: UnitGate
    ) -> list[SpeechAudio | Exception]:
        """Blocking: one `SpeechAudio` per request, in order (an ``UnknownVoice`` instance
        for a request whose voice it lacks); ``gate.next_unit()`` between units."""
        ...
