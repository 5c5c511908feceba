"""espeak-ng as a speech runner: the default TTS, offline and fast on one core.

Requests run one after another (the library is process-global and not
thread-safe, `ESPEAK_LOCK`). Units are elastic (``elastic_unit_s``): the library
hands its audio back in blocks of about 60 ms, each a fraction of a millisecond
to make, and waits while its callback does, so a unit ends at the first block
boundary past `UNIT_S` before the next tick (`UnitGate.until`), and at the
end of each sentence; ``gate.next_unit()`` then waits for the next window (the
first unit is granted before the call). With no realtime work the window never
closes and the synthesis runs straight through. A withdrawn batch stops at its
next unit. A request with an unknown voice fails alone (its result is the
`UnknownVoice`).

Sentences as units were too coarse for the windows between ticks: measured
beside 64 loopback sessions (a tick every 20 ms) on a 2-core host, a sentence
took 10-20 ms, its estimate often did not fit the window left, and the strict
rule gave the TTS 0.40-0.45x of its rate alone (docs/benchmarks.md).

``speed`` becomes espeak's rate (175 words per minute at 1.0). espeak-ng
speaks no slower than 80 words per minute, so below ``speed = 80 / 175`` the
rest of the slowdown is a longer gap between words (`_slow`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import numpy as np

from duplex.exceptions import UnknownVoice

from ._espeak import ESPEAK_RATE_WPM, MIN_RATE_WPM, Espeak, espeak
from ._sentences import split_sentences
from ._speech import SpeechAudio, SpeechRequest, UnitGate, VoiceInfo, speech_metadata
from ._voices import OPENAI_TO_ESPEAK

__all__ = ["EspeakRunner"]

UNIT_S = 0.001
"""How long before the next tick a unit ends (`UnitGate.until`: a block takes well under
this), and the least window a unit asks for."""

_PROBE_GAP = 20
"""Word gap of the probe synthesis that measures how much a gap slows a sentence."""


def _at_blocks(
    gate: UnitGate, timer: Callable[[], float] = time.perf_counter
) -> Callable[[], None]:
    """espeak's ``between_blocks``: ends the unit at a block boundary near its window's close."""

    def at_block() -> None:
        if timer() >= gate.until:
            gate.next_unit()

    return at_block


def _slow(
    engine: Espeak, text: str, voice: str, speed: float, blocks: Callable[[], None]
) -> np.ndarray:
    """``text`` slower than espeak's floor rate: at the floor rate, with the word gap that
    stretches it to ``speed``'s length, measured on a probe (the gap's effect depends on the
    words), then padded with silence to the length if it still falls short."""
    plain = engine.synthesize(text, voice, rate_wpm=MIN_RATE_WPM, between_blocks=blocks)
    target = round(plain.size * MIN_RATE_WPM / (ESPEAK_RATE_WPM * speed))
    probe = engine.synthesize(
        text, voice, rate_wpm=MIN_RATE_WPM, word_gap=_PROBE_GAP, between_blocks=blocks
    )
    per_unit = (probe.size - plain.size) / _PROBE_GAP
    pcm = plain
    if per_unit > 0:
        gap = max(0, round((target - plain.size) / per_unit))
        pcm = engine.synthesize(
            text, voice, rate_wpm=MIN_RATE_WPM, word_gap=gap, between_blocks=blocks
        )
    if pcm.size < target:
        pcm = np.concatenate([pcm, np.zeros(target - pcm.size, dtype=np.int16)])
    return pcm


@final
class EspeakRunner:
    """Text to int16 PCM with espeak-ng (`SpeechRunner`).

    Args:
        engine: the loaded library (default: the process's, from the ``espeakng-loader`` wheel).
        max_batch: requests taken per `run_batch` (they still run one at a time).
    """

    name = "tts"
    elastic_unit_s = UNIT_S

    def __init__(self, engine: Espeak | None = None, *, max_batch: int = 8) -> None:
        self._engine = engine or espeak()
        self.max_batch = max_batch
        self.sample_rate = self._engine.sample_rate
        installed = self._engine.voices()
        self._languages: dict[str, str] = {}  # language tag -> espeak's voice file name
        for v in installed:
            if not v.variant:
                self._languages.setdefault(v.key, v.identifier.rsplit("/", 1)[-1])
        self._variants = {v.key for v in installed if v.variant}
        for name, target in OPENAI_TO_ESPEAK.items():
            if self._resolve(target) is None:
                raise UnknownVoice(f"voice {name!r} maps to {target!r}, which is not installed")
        aliases = [
            VoiceInfo(name, target, alias=True, language=target.split("+")[0])
            for name, target in OPENAI_TO_ESPEAK.items()
        ]
        own = [
            VoiceInfo(key, key, language=key)
            for key in sorted(self._languages)
            if key not in OPENAI_TO_ESPEAK
        ]
        self._voices = tuple(aliases + own)

    @property
    def variants(self) -> tuple[str, ...]:
        """espeak voice variants a voice may add as ``language+variant`` (``en-us+Andy``)."""
        return tuple(sorted(self._variants))

    def voices(self) -> tuple[VoiceInfo, ...]:
        return self._voices

    @property
    def metadata(self) -> Mapping[str, Any]:
        return speech_metadata("espeak", self.sample_rate, self._voices, self.variants)

    def _resolve(self, voice: str) -> str | None:
        """What espeak is asked for (``en-GB-x-rp+m7``) for ``voice``: an OpenAI name, a
        language tag (``en-gb``), or ``language+variant``; ``None``: not installed."""
        target = OPENAI_TO_ESPEAK.get(voice, voice)
        language, plus, variant = target.partition("+")
        file = self._languages.get(language)
        if file is None or (plus and variant not in self._variants):
            return None
        return f"{file}+{variant}" if plus else file

    def check_voice(self, voice: str) -> None:
        if self._resolve(voice) is None:
            raise self._unknown(voice)

    def _unknown(self, voice: str) -> UnknownVoice:
        names = ", ".join(OPENAI_TO_ESPEAK)
        return UnknownVoice(
            f"unknown voice {voice!r}: use one of {names}, an installed espeak language "
            "(GET /v1/audio/voices), or language+variant"
        )

    def run_batch(
        self, requests: Sequence[SpeechRequest], gate: UnitGate
    ) -> list[SpeechAudio | Exception]:
        out: list[SpeechAudio | Exception] = []
        first = True
        for request in requests:
            voice = self._resolve(request.voice)
            if voice is None:  # fails this request alone
                out.append(self._unknown(request.voice))
                continue
            out.append(self._speak(request, voice, gate, first=first))
            first = False
        return out

    def _speak(
        self, request: SpeechRequest, voice: str, gate: UnitGate, *, first: bool
    ) -> SpeechAudio:
        wpm = ESPEAK_RATE_WPM * request.speed
        parts: list[np.ndarray] = []
        blocks = _at_blocks(gate)
        for sentence in split_sentences(request.text):
            if not first:  # the batch's first unit was granted before the call
                gate.next_unit()
            first = False
            if wpm < MIN_RATE_WPM:
                parts.append(_slow(self._engine, sentence, voice, request.speed, blocks))
            else:
                parts.append(
                    self._engine.synthesize(
                        sentence, voice, rate_wpm=round(wpm), between_blocks=blocks
                    )
                )
        pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
        return SpeechAudio(pcm, self.sample_rate)
