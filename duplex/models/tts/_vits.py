"""A transformers VITS / MMS-TTS checkpoint as a batched speech runner.

Loaded from a local folder (``VitsModel`` + ``VitsTokenizer``, as
``save_pretrained`` writes them): weights never download. One `run_batch`
splits every request into sentences and runs the sentences of all its
requests together, padded, in forwards of at most ``max_sentences``, grouped by
speed and speaker (VITS takes one of each per forward); each sentence's audio is cut
to its own length (``sequence_lengths``). ``gate.next_unit()`` comes between
forwards (the first is granted before the call).

Voices: a multi-speaker checkpoint offers ``speaker-0`` … and maps OpenAI's
names onto distinct speakers while there are enough; a single-speaker one has
one voice, which every OpenAI name speaks with.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, final

import numpy as np

from duplex.exceptions import SpeechError, UnknownVoice
from duplex.pcm import float_to_pcm16

from ._sentences import split_sentences
from ._speech import SpeechAudio, SpeechRequest, UnitGate, VoiceInfo, speech_metadata
from ._voices import OPENAI_VOICES

__all__ = ["VitsRunner"]


@final
class VitsRunner:
    """Text to int16 PCM with a local VITS checkpoint (`SpeechRunner`).

    Args:
        path: the checkpoint folder (``config.json``, weights, ``vocab.json``).
        device: torch device to run on.
        max_batch: requests taken per `run_batch`.
        max_sentences: sentences per forward; by default 16 on a GPU and 1 on the CPU, where
            a padded forward cost more than the same sentences one by one (docs/benchmarks.md,
            "VITS").
        seed: seed of the sampling noise (each forward starts from it, so a result does
            not depend on what ran before).
    """

    name = "tts"

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cpu",
        max_batch: int = 16,
        max_sentences: int | None = None,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import VitsModel, VitsTokenizer

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise SpeechError(f"no VITS checkpoint at {folder} (config.json missing)")
        self._torch = torch
        self._model: Any = VitsModel.from_pretrained(folder, local_files_only=True).to(device)
        self._model.eval()
        self._tokenizer: Any = VitsTokenizer.from_pretrained(folder, local_files_only=True)
        self._device = device
        self._name = folder.name
        """The checkpoint's folder name: the model's name to clients."""
        self._seed = seed
        self._lock = threading.Lock()
        self.max_batch = max_batch
        self.max_sentences = max_sentences or (1 if device == "cpu" else 16)
        self.sample_rate = int(self._model.config.sampling_rate)
        speakers = max(1, int(self._model.config.num_speakers))
        self._speakers = speakers
        self._ids: dict[str, int] = {f"speaker-{i}": i for i in range(speakers)}
        for i, name in enumerate(OPENAI_VOICES):
            self._ids[name] = i % speakers
        aliases = [
            VoiceInfo(name, f"speaker-{i % speakers}", alias=True)
            for i, name in enumerate(OPENAI_VOICES)
        ]
        own = [VoiceInfo(f"speaker-{i}", f"speaker-{i}") for i in range(speakers)]
        self._voices = tuple(aliases + own)

    def voices(self) -> tuple[VoiceInfo, ...]:
        return self._voices

    @property
    def metadata(self) -> Mapping[str, Any]:
        return speech_metadata(self._name, self.sample_rate, self._voices)

    def check_voice(self, voice: str) -> None:
        if voice not in self._ids:
            raise self._unknown(voice)

    def _unknown(self, voice: str) -> UnknownVoice:
        return UnknownVoice(f"unknown voice {voice!r}: use one of {', '.join(self._ids)}")

    def run_batch(
        self, requests: Sequence[SpeechRequest], gate: UnitGate
    ) -> list[SpeechAudio | Exception]:
        known = [r for r in requests if r.voice in self._ids]
        spoken = iter(self._run(known, gate))
        # a request with an unknown voice fails alone (its result is the `UnknownVoice`)
        return [next(spoken) if r.voice in self._ids else self._unknown(r.voice) for r in requests]

    def _run(self, requests: Sequence[SpeechRequest], gate: UnitGate) -> list[SpeechAudio]:
        # Every sentence of every request, in order; a forward takes sentences of one speed
        # and one speaker (VITS takes one of each per forward).
        units = [
            ((r.speed, self._ids[r.voice]), i, text)
            for i, r in enumerate(requests)
            for text in split_sentences(r.text)
        ]
        waves: list[np.ndarray] = [np.zeros(0, dtype=np.int16)] * len(units)
        forwards = 0
        for key in dict.fromkeys(key for key, _, _ in units):
            same = [k for k, unit in enumerate(units) if unit[0] == key]
            for start in range(0, len(same), self.max_sentences):
                chunk = same[start : start + self.max_sentences]
                if forwards:  # the batch's first unit was granted before the call
                    gate.next_unit()
                forwards += 1
                texts = [units[k][2] for k in chunk]
                for k, wave in zip(chunk, self._forward(texts, *key), strict=True):
                    waves[k] = wave
        audio: list[list[np.ndarray]] = [[] for _ in requests]
        for (_, i, _), wave in zip(units, waves, strict=True):
            audio[i].append(wave)
        return [
            SpeechAudio(np.concatenate(parts) if parts else np.zeros(0, np.int16), self.sample_rate)
            for parts in audio
        ]

    def _forward(self, texts: list[str], speed: float, speaker: int) -> list[np.ndarray]:
        """One padded forward over ``texts``: each one's int16 waveform, cut to its length."""
        torch = self._torch
        inputs = self._tokenizer(texts, return_tensors="pt", padding=True)
        kwargs: dict[str, Any] = {
            "input_ids": inputs["input_ids"].to(self._device),
            "attention_mask": inputs["attention_mask"].to(self._device),
            "speaking_rate": speed,
        }
        if self._speakers > 1:
            kwargs["speaker_id"] = speaker
        with self._lock, torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._seed)
            output = self._model(**kwargs)
        waves = output.waveform.float().cpu().numpy()
        lengths = output.sequence_lengths.cpu().numpy()
        return [
            float_to_pcm16(np.clip(wave[: int(n)], -1.0, 1.0))
            for wave, n in zip(waves, lengths, strict=True)
        ]
