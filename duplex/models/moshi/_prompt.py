"""PersonaPlex system prompts: the token sequence a slot replays before it goes live.

NVIDIA's PersonaPlex loop (``LMGen.step_system_prompts``) conditions the model
with one LM call per frame of, in order:

1. the voice prompt: each 80 ms frame of a reference recording, Mimi-encoded,
   forced into the *agent* audio stream, with text PAD;
2. 0.5 s (6 frames) of silence: the agent stream forced to `SILENCE_CODES`, text PAD;
3. the text prompt: ``"<system> {text} <system>"`` tokenized by the checkpoint's
   sentencepiece model, one token per frame forced into the text stream, the
   agent stream forced to silence;
4. 6 more silence frames.

Throughout, the *user* stream gets `SINE_CODES` (the codes of a 440 Hz tone the
model was trained to read as "nobody is talking yet"). Each call provides the
tokens of column ``call + delay`` of every stream.

Our frame ``n`` is the reference's call ``n + 1`` (its call 0 runs no model and
everything it writes is overwritten by start tokens; that is what
``MoshiConfig.user_lag == 1`` mirrors). So a sequence of ``L`` calls is
`PromptReplay`: ``L - 1`` *held* frames that take the user codes from the
sequence (no user input is consumed) and force every stream, then the slot is
live; the streams with delay ``d`` keep being forced for ``d`` more frames (the
acoustic codebooks of the last silence frame reach the first live frame), as in
the reference, where they were written ahead of time.

Voices: a name resolves to ``voices/<name>.wav`` (or ``<name>.wav``) in the
checkpoint folder. The reference's precomputed ``voices/<name>.pt`` files hold
temporal-transformer *input embeddings* plus a saved token cache, replayed
through a separate embeddings step our static (graphed) step does not have, so
they are refused: put the WAV the embeddings were made from next to them. The
reference normalises the WAV to -24 LUFS (pyloudnorm); we scale it to -24 dBFS
RMS, which is close for speech but not identical.
"""

from __future__ import annotations

import re
import threading
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

import numpy as np
import numpy.typing as npt
import torch

from duplex.exceptions import PromptUnsupported

from ._config import MoshiConfig

__all__ = [
    "PROMPT_SILENCE_FRAMES",
    "SILENCE_CODES",
    "SINE_CODES",
    "PromptReplay",
    "VoiceLibrary",
    "build_replay",
    "prompt_codes",
    "wrap_with_system_tags",
]

SILENCE_CODES = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
"""The reference's Mimi codes of a silent frame (``lm.SILENCE_TOKENS``)."""
SINE_CODES = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
"""The reference's Mimi codes of a 440 Hz tone frame (``lm.SINE_TOKENS``)."""
PROMPT_SILENCE_FRAMES = 6
"""``int(0.5 s * 12.5 Hz)``: silence frames after the voice and after the text prompt."""
_TARGET_RMS = 10 ** (-24 / 20)
_VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def wrap_with_system_tags(text: str) -> str:
    """``"<system> text <system>"`` unless the text already carries the tags (as the reference)."""
    cleaned = text.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


def prompt_codes(config: MoshiConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(silence, sine) codes for ``config``'s codebooks.

    The reference constants belong to the official 2048-bin Mimi; for other codecs
    (``tiny``) they are taken modulo ``card``, arbitrary but fixed codes.
    """
    if config.agent_q != len(SILENCE_CODES) or config.user_q != len(SINE_CODES):
        raise PromptUnsupported(f"{config.name}: prompts need 8 agent and 8 user codebooks")
    return (
        tuple(c % config.card for c in SILENCE_CODES),
        tuple(c % config.card for c in SINE_CODES),
    )


@final
@dataclass(frozen=True, slots=True)
class PromptReplay:
    """One prompt as per-frame tensors (see the module docstring).

    Args:
        held: frames that consume no user input (``L - 1``).
        user: ``[held, user_q]`` user codes of the held frames.
        forced: ``[held + max_delay, 1 + agent_q]`` tokens forced at each frame
            (``-1``: sample); the rows past ``held`` force only delayed streams.
    """

    held: int
    user: torch.Tensor = field(repr=False)
    forced: torch.Tensor = field(repr=False)

    @property
    def frames(self) -> int:
        """Frames with any forcing (held plus the delayed tail)."""
        return int(self.forced.shape[0])


def build_replay(
    config: MoshiConfig,
    initial: list[int],
    text_tokens: list[int],
    voice_codes: torch.Tensor | None,
    device: torch.device,
) -> PromptReplay:
    """The `PromptReplay` of a voice (``[V, agent_q]`` codes) and text tokens.

    Args:
        config: the LM's configuration (delays, PAD, codebooks).
        initial: the start token of every stream (``MoshiLM.initial_tokens``).
        text_tokens: the tokenized, tagged text prompt (may be empty).
        voice_codes: the voice prompt's Mimi codes, or ``None``.
        device: where the tensors live.
    """
    silence, sine = prompt_codes(config)
    pad = config.text_padding_id
    agent = config.agent_q
    rows: list[list[int]] = []  # per reference call: text, agent codes..., user codes...
    if voice_codes is not None:
        for codes in voice_codes.tolist():
            rows.append([pad, *codes, *sine])
    rows += [[pad, *silence, *sine]] * PROMPT_SILENCE_FRAMES
    rows += [[token, *silence, *sine] for token in text_tokens]
    rows += [[pad, *silence, *sine]] * PROMPT_SILENCE_FRAMES
    calls = torch.tensor(rows, dtype=torch.long)
    length = calls.shape[0]
    held = length - 1
    delays = config.delays[: 1 + agent]
    forced = torch.full((held + max(delays), 1 + agent), -1, dtype=torch.long)
    for n in range(forced.shape[0]):
        column = n + 1  # frame n samples column n + 1 (the reference's call n + 1)
        for k, delay in enumerate(delays):
            source = column - delay
            if column <= delay:
                forced[n, k] = initial[k]  # the reference overwrites these with start tokens
            elif source < length:
                forced[n, k] = calls[source, k]
    user = calls[1:, 1 + agent :]
    return PromptReplay(held, user.to(device), forced.to(device))


@final
class VoiceLibrary:
    """Voice prompts of one checkpoint folder, read once and kept as 24 kHz float PCM.

    Thread-safe: `check` runs on the caller of `Engine.acquire_slot`, `pcm` on the
    engine's step thread.

    Args:
        folder: the checkpoint folder (``voices/`` inside it is searched first).
        sample_rate: Mimi's sample rate.
    """

    def __init__(self, folder: Path, sample_rate: int) -> None:
        self._folder = folder
        self._rate = sample_rate
        self._lock = threading.Lock()
        self._pcm: dict[str, npt.NDArray[np.float32]] = {}

    def check(self, name: str) -> None:
        """Load ``name`` (if not already loaded).

        Raises:
            PromptUnsupported: a bad name, no such voice, an embeddings-only voice, or
                an unreadable WAV.
        """
        with self._lock:
            if name in self._pcm:
                return
        pcm = self._load(name)
        with self._lock:
            self._pcm.setdefault(name, pcm)

    def pcm(self, name: str) -> npt.NDArray[np.float32]:
        """The voice's samples (loading them if `check` did not)."""
        self.check(name)
        with self._lock:
            return self._pcm[name]

    def _load(self, name: str) -> npt.NDArray[np.float32]:
        stem = name.removesuffix(".wav").removesuffix(".pt")
        if not _VOICE_NAME.match(stem) or ".." in stem:
            raise PromptUnsupported(f"voice name {name!r} is not a plain file name")
        for path in (self._folder / "voices" / f"{stem}.wav", self._folder / f"{stem}.wav"):
            if path.is_file():
                return _read_wav(path, self._rate)
        if (self._folder / "voices" / f"{stem}.pt").is_file():
            raise PromptUnsupported(
                f"voice {stem!r} exists only as embeddings (voices/{stem}.pt), which are not "
                f"supported; add voices/{stem}.wav"
            )
        raise PromptUnsupported(f"no voice {stem!r} in {self._folder} (voices/{stem}.wav)")


def _read_wav(path: Path, rate: int) -> npt.NDArray[np.float32]:
    """A PCM WAV as mono float32 at ``rate`` (linear resampling), scaled to -24 dBFS RMS."""
    try:
        with wave.open(str(path), "rb") as wav:
            width, channels, src_rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise PromptUnsupported(f"{path}: not a readable PCM WAV ({exc})") from None
    kinds = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2.0**31)}
    if width not in kinds:
        raise PromptUnsupported(f"{path}: {8 * width}-bit WAV is not supported (8, 16, 32 bit)")
    dtype, offset, scale = kinds[width]
    samples = (np.frombuffer(raw, dtype=dtype).astype(np.float64) - offset) / scale
    samples = samples.reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise PromptUnsupported(f"{path}: the WAV holds no samples")
    if src_rate != rate:
        count = max(1, round(samples.size * rate / src_rate))
        samples = np.interp(np.arange(count) * src_rate / rate, np.arange(samples.size), samples)
    rms = float(np.sqrt(np.mean(samples**2)))
    if rms > 0:
        samples = samples * (_TARGET_RMS / rms)
    return np.clip(samples, -1.0, 1.0).astype(np.float32)
