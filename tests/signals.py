"""Synthetic test signals shared by the VAD tests (models, sessions, end to end).

espeak-ng is not guaranteed on test machines, so speech is synthetic: `voiced`
is a source-filter signal on which silero fires (> 0.5 on nearly every 32 ms
window), while silence, white noise and a pure tone stay under its threshold.
"""

from __future__ import annotations

import numpy as np

_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480))


def voiced(seconds: float, seed: int = 0, f0: float = 120.0, rate: int = 16_000) -> np.ndarray:
    """Speech-like float32 audio at ``rate`` Hz: a glottal harmonic series (f0 with drift
    and vibrato) shaped by three formant resonances that glide between vowels, in 250 ms
    syllables. Peak 0.3."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    pitch = f0 * (1 + 0.08 * np.sin(2 * np.pi * 0.7 * t) + 0.02 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    syllable = (t // 0.25).astype(int)
    frac = (t % 0.25) / 0.25
    formants = np.array(_VOWELS, float)[rng.integers(0, len(_VOWELS), syllable.max() + 2)]
    track = formants[syllable] * (1 - frac[:, None]) + formants[syllable + 1] * frac[:, None]
    bandwidth = np.array([80.0, 100.0, 140.0])
    out = np.zeros(n)
    for k in range(1, 40):
        fk = k * pitch
        gain = (1 / (1 + ((fk[:, None] - track) / bandwidth) ** 2)).sum(axis=1) / np.sqrt(k)
        out += gain * (fk < 5000) * np.sin(k * phase)
    out *= np.sin(np.pi * frac) ** 0.6  # syllable amplitude modulation
    out += 0.01 * rng.standard_normal(n)
    return (0.3 * out / np.abs(out).max()).astype(np.float32)


def pcm16(audio: np.ndarray) -> bytes:
    """Float audio in [-1, 1] as little-endian PCM16 bytes."""
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
