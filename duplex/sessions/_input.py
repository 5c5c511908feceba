"""Client audio on its way to the model: resampling, the energy VAD, the input clock.

Split from ``_state`` to keep modules small; it decides nothing about turns.
Refusals (``input_backpressure``, ``input_audio_buffer_empty``) are raised
before anything changes, so the machine answers them with one ``error``.

The input buffer is a span of the input clock: ``buffer_start`` (samples) to
``samples``. A commit closes a part of it (``[start, end)``, the rest stays for
the next turn). Under ``turn_policy="turn_based"`` the audio itself is kept
(bounded by ``max_turn_audio_ms``, oldest dropped and counted) so a committed
turn has its audio for the history and the turn responder.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from duplex.exceptions import InputAudioBufferEmpty, InputBackpressure

from ._config import SessionConfig, TurnPolicy, VadMode
from ._events import AudioAppend, Pcm, SpeechStarted, SpeechStopped
from ._ledger import InputLedger
from ._resample import StreamingResampler
from ._vad import EnergyVad

__all__ = ["InputPath"]

VAD_KEYS = (
    *("vad", "turn_detection", "vad_threshold", "vad_threshold_rms", "vad_hangover_ms"),
    "vad_prepare_ms",
)


class InputPath:
    """The input side of one session.

    ``samples`` counts model-rate input received; ``uncommitted`` the part of the
    buffer not yet closed by a commit. The ledger counts PCM16 bytes at the model rate.
    """

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.ledger = InputLedger(
            max_bytes=config.max_pending_input_bytes, max_turns=config.max_pending_turns
        )
        self.samples = 0
        self.buffer_start = 0
        self.kept_dropped_samples = 0
        self._kept: deque[Pcm] = deque()
        self._kept_start = 0  # input-clock sample of the first kept sample
        self._kept_size = 0
        self._resampler: StreamingResampler | None = None
        self._vad: EnergyVad | None = None
        self._vad_offset_ms = 0.0
        self.reset_vad()

    @property
    def uncommitted(self) -> int:
        """Model-rate samples appended since the last commit or clear."""
        return self.samples - self.buffer_start

    @property
    def input_ms(self) -> float:
        """The input audio clock in ms."""
        return self.to_ms(self.samples)

    @property
    def buffer_start_ms(self) -> float:
        """Where the uncommitted buffer starts on the input clock."""
        return self.to_ms(self.buffer_start)

    @property
    def speech_ms(self) -> float:
        """Where the latest speech ended on the input clock (the clock itself without a VAD).

        Overlap is measured up to here, so the VAD's hangover never counts as speech.
        """
        if self._vad is None or not self._vad.speaking:
            return self.input_ms
        return self._vad_offset_ms + self._vad.last_speech_ms

    def to_ms(self, samples: int) -> float:
        """Model-rate samples to ms."""
        return samples * 1000.0 / self.config.model_sample_rate

    def to_samples(self, ms: float) -> int:
        """Ms on the input clock to model-rate samples (rounded)."""
        return round(ms * self.config.model_sample_rate / 1000.0)

    def reconfigure(self, config: SessionConfig) -> bool:
        """Take a new config; returns whether the VAD restarted (a VAD setting changed)."""
        vad_changed = any(getattr(config, k) != getattr(self.config, k) for k in VAD_KEYS)
        self.config = config
        if config.turn_policy != TurnPolicy.TURN_BASED:
            self._drop_kept(self.samples)
        if vad_changed:
            self.reset_vad()
        return vad_changed

    def reset_vad(self) -> None:
        """Start the built-in VAD afresh (or drop it: ``vad="external"`` or no turn detection)."""
        cfg = self.config
        self._vad = None
        if cfg.vad is VadMode.ENERGY and cfg.vad_enabled:
            self._vad = EnergyVad(
                cfg.model_sample_rate,
                threshold_rms=cfg.energy_threshold_rms,
                min_speech_ms=cfg.vad_min_speech_ms,
                hangover_ms=cfg.vad_hangover_ms,
            )
        self._vad_offset_ms = self.input_ms

    def append(self, event: AudioAppend) -> tuple[Pcm, float, list[SpeechStarted | SpeechStopped]]:
        """Resample and account one chunk.

        Returns:
            The model-rate PCM, its start on the input clock, and the speech
            boundaries the built-in VAD found in it (on the input clock, unpadded).

        Raises:
            InputBackpressure: the pending input would pass ``max_pending_input_bytes``.
        """
        config = self.config
        rate = event.sample_rate or config.input_sample_rate
        resampler = self._resampler
        if resampler is None or resampler.in_rate != rate:
            resampler = self._resampler = StreamingResampler(rate, config.model_sample_rate)
        # Same rate: the model takes the client's samples as they are. An event's pcm is
        # read-only and never changed (``_checks.float_pcm``), so it is passed on without
        # the copy the identity resampler would make.
        identity = resampler.identity
        size = event.pcm.size if identity else resampler.output_count(event.pcm.size)
        if not self.ledger.try_append(size * 2):
            limit = config.max_pending_input_bytes
            raise InputBackpressure(f"pending input is over {limit} bytes; slow down")
        pcm = event.pcm if identity else resampler.process(event.pcm)
        start_ms = self.input_ms
        self.samples += pcm.size
        if config.turn_policy == TurnPolicy.TURN_BASED and pcm.size:
            self._keep(pcm)
        speech: list[SpeechStarted | SpeechStopped] = []
        if self._vad is not None:
            for found in self._vad.process(pcm):
                at_ms = found.audio_ms + self._vad_offset_ms
                speech.append(
                    SpeechStarted(at_ms)
                    if isinstance(found, SpeechStarted)
                    else SpeechStopped(at_ms)
                )
        return pcm, start_ms, speech

    def commit(
        self,
        start_ms: float | None = None,
        end_ms: float | None = None,
        *,
        count_turn: bool = True,
    ) -> tuple[float, float, Pcm | None]:
        """Close the user turn ``[start_ms, end_ms)`` of the buffer (default: all of it).

        Audio before ``start_ms`` is dropped (VAD prefix trimming); audio after
        ``end_ms`` stays in the buffer for the next turn.

        Returns:
            The turn's start and end on the input clock, and its kept audio
            (``None`` unless ``turn_policy`` is ``turn_based``).

        Raises:
            InputAudioBufferEmpty: nothing appended since the last commit or clear.
            InputBackpressure: ``count_turn`` and ``max_pending_turns`` turns are
                still unanswered (the model answers every counted turn).
        """
        end = self.samples if end_ms is None else self.to_samples(end_ms)
        end = min(max(end, self.buffer_start), self.samples)
        start = self.buffer_start if start_ms is None else self.to_samples(start_ms)
        start = min(max(start, self.buffer_start), end)
        if end <= self.buffer_start:
            raise InputAudioBufferEmpty("no uncommitted input audio")
        if count_turn and not self.ledger.try_commit_turn():
            limit = self.config.max_pending_turns
            raise InputBackpressure(f"{limit} committed turns are still unanswered")
        pcm = self._slice(start, end) if self.config.turn_policy == TurnPolicy.TURN_BASED else None
        self.buffer_start = end
        self._drop_kept(end)
        return self.to_ms(start), self.to_ms(end), pcm

    def clear(self) -> None:
        """Drop uncommitted input and what the model had queued; restart the VAD."""
        self.buffer_start = self.samples
        self._drop_kept(self.samples)
        self.ledger.clear()
        self.reset_vad()

    # ---------------------------------------------------------------- kept audio

    def _keep(self, pcm: Pcm) -> None:
        if not self._kept:
            self._kept_start = self.samples - pcm.size
        self._kept.append(pcm)
        self._kept_size += pcm.size
        limit = self.to_samples(self.config.max_turn_audio_ms)
        while self._kept_size > limit and len(self._kept) > 1:
            self._drop_first()

    def _drop_first(self) -> None:
        first = self._kept.popleft()
        self._kept_size -= first.size
        self._kept_start += first.size
        if self._kept_start <= self.buffer_start:
            return
        self.kept_dropped_samples += min(first.size, self._kept_start - self.buffer_start)

    def _drop_kept(self, before: int) -> None:
        """Forget kept audio before input-clock sample ``before``."""
        while self._kept and self._kept_start + self._kept[0].size <= before:
            first = self._kept.popleft()
            self._kept_size -= first.size
            self._kept_start += first.size
        if self._kept and self._kept_start < before:
            cut = before - self._kept_start
            self._kept[0] = self._kept[0][cut:]
            self._kept_size -= cut
            self._kept_start = before
        if not self._kept:
            self._kept_start = before

    def _slice(self, start: int, end: int) -> Pcm:
        if not self._kept:
            return np.zeros(0, dtype=np.float32)
        joined = np.concatenate(list(self._kept))
        lo = max(0, start - self._kept_start)
        hi = max(lo, end - self._kept_start)
        out = np.array(joined[lo:hi], dtype=np.float32)
        out.flags.writeable = False
        return out
