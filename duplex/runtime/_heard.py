"""A session's input at 16 kHz, resampled once for everything that listens to it.

The shared VAD (`VadLink`) and the agent's ASR (`AgentLink`) both hear the session's
input at 16 kHz. The session actor resamples each model-rate chunk once here and hands
both the same `Heard` chunk, so the work (and the filter state) is not doubled.

Clock. A resampler started at input time ``origin`` makes its ``k``-th output sample
for input time ``origin + k / 16`` ms, late by its group delay. `Heard.start_ms` is
that (undelayed) time of the chunk's first sample and `Heard.delay_ms` the delay, so a
listener maps its own sample counts back to the input clock without knowing the
resampler. A gap in the input clock (more than one model-rate sample) or `restart`
(the input was cleared) starts a new run: a fresh resampler, `Heard.fresh` set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from duplex.resample import Pcm, StreamingResampler

__all__ = ["HEARD_RATE", "Heard", "Hearing"]

HEARD_RATE = 16_000
"""The rate the VAD and the ASR take (``VAD_SAMPLE_RATE`` and ``ASR_SAMPLE_RATE``)."""


@final
@dataclass(frozen=True, slots=True)
class Heard:
    """One input chunk at 16 kHz (module docstring: the clock).

    Args:
        samples: float32 samples at `HEARD_RATE` (may be empty: the filter is filling).
        start_ms: input-clock time of the first sample, before the resampler's delay.
        end_ms: input-clock end of the model-rate chunk these came from.
        delay_ms: the resampler's group delay.
        fresh: the first chunk of a run (a new resampler).
    """

    samples: Pcm
    start_ms: float
    end_ms: float
    delay_ms: float
    fresh: bool


@final
class Hearing:
    """The session's input at 16 kHz, one resampler for every listener.

    Args:
        model_rate: the session's input rate (the model's).
    """

    def __init__(self, model_rate: int) -> None:
        self.model_rate = model_rate
        self._resampler: StreamingResampler | None = None
        self._origin_ms = 0.0
        self._next_ms = 0.0

    def push(self, pcm: Pcm, start_ms: float) -> Heard:
        """Resample one model-rate chunk that starts at ``start_ms`` on the input clock."""
        resampler = self._resampler
        fresh = resampler is None or abs(start_ms - self._next_ms) > 1000.0 / self.model_rate
        if resampler is None or fresh:
            resampler = self._resampler = StreamingResampler(self.model_rate, HEARD_RATE)
            self._origin_ms = start_ms
        before = resampler.produced
        samples = resampler.process(np.asarray(pcm, dtype=np.float32))
        self._next_ms = start_ms + len(pcm) * 1000.0 / self.model_rate
        return Heard(
            samples,
            self._origin_ms + before * 1000.0 / HEARD_RATE,
            self._next_ms,
            resampler.delay_samples * 1000.0 / HEARD_RATE,
            fresh,
        )

    def restart(self) -> None:
        """The input was cleared: the next chunk starts a new run (no stale filter history)."""
        self._resampler = None
