"""Client audio on its way to the model: resampling, the energy VAD, the input clock.

Split from ``_state`` to keep modules small; it decides nothing about turns.
Refusals (``input_backpressure``, ``input_audio_buffer_empty``) are raised
before anything changes, so the machine answers them with one ``error``.
"""

from __future__ import annotations

from duplex.exceptions import InputAudioBufferEmpty, InputBackpressure

from ._config import SessionConfig
from ._events import AudioAppend, Pcm, SpeechStarted, SpeechStopped
from ._ledger import InputLedger
from ._resample import StreamingResampler
from ._vad import EnergyVad

__all__ = ["InputPath"]


class InputPath:
    """The input side of one session.

    ``samples`` counts model-rate input received; ``uncommitted`` the part not
    yet closed by a commit. The ledger counts PCM16 bytes at the model rate.
    """

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.ledger = InputLedger(
            max_bytes=config.max_pending_input_bytes, max_turns=config.max_pending_turns
        )
        self.samples = 0
        self.uncommitted = 0
        self._resampler: StreamingResampler | None = None
        self._vad: EnergyVad | None = None
        self._vad_offset_ms = 0.0
        self.reset_vad()

    @property
    def input_ms(self) -> float:
        """The input audio clock in ms."""
        return self.samples * 1000.0 / self.config.model_sample_rate

    @property
    def speech_ms(self) -> float:
        """Where the latest speech ended on the input clock (the clock itself without a VAD).

        Overlap is measured up to here, so the VAD's hangover never counts as speech.
        """
        if self._vad is None or not self._vad.speaking:
            return self.input_ms
        return self._vad_offset_ms + self._vad.last_speech_ms

    def reconfigure(self, config: SessionConfig) -> None:
        """Take a new config; a changed VAD mode restarts the VAD."""
        vad_changed = config.vad != self.config.vad
        self.config = config
        if vad_changed:
            self.reset_vad()

    def reset_vad(self) -> None:
        """Start the built-in VAD afresh (or drop it for ``vad="external"``)."""
        cfg = self.config
        self._vad = None
        if cfg.vad == "energy":
            self._vad = EnergyVad(
                cfg.model_sample_rate,
                threshold_rms=cfg.vad_threshold_rms,
                min_speech_ms=cfg.vad_min_speech_ms,
                hangover_ms=cfg.vad_hangover_ms,
            )
        self._vad_offset_ms = self.input_ms

    def append(self, event: AudioAppend) -> tuple[Pcm, float, list[SpeechStarted | SpeechStopped]]:
        """Resample and account one chunk.

        Returns:
            The model-rate PCM, its start on the input clock, and the speech
            boundaries the built-in VAD found in it (on the input clock).

        Raises:
            InputBackpressure: the pending input would pass ``max_pending_input_bytes``.
        """
        rate = event.sample_rate or self.config.input_sample_rate
        if self._resampler is None or self._resampler.in_rate != rate:
            self._resampler = StreamingResampler(rate, self.config.model_sample_rate)
        if not self.ledger.try_append(self._resampler.output_count(event.pcm.size) * 2):
            limit = self.config.max_pending_input_bytes
            raise InputBackpressure(f"pending input is over {limit} bytes; slow down")
        pcm = self._resampler.process(event.pcm)
        start_ms = self.input_ms
        self.samples += pcm.size
        self.uncommitted += pcm.size
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

    def commit(self) -> float:
        """Close the user turn; returns its audio length in ms.

        Raises:
            InputAudioBufferEmpty: nothing appended since the last commit or clear.
            InputBackpressure: ``max_pending_turns`` turns are still unanswered.
        """
        if self.uncommitted == 0:
            raise InputAudioBufferEmpty("no uncommitted input audio")
        if not self.ledger.try_commit_turn():
            limit = self.config.max_pending_turns
            raise InputBackpressure(f"{limit} committed turns are still unanswered")
        turn_ms = self.uncommitted * 1000.0 / self.config.model_sample_rate
        self.uncommitted = 0
        return turn_ms

    def clear(self) -> None:
        """Drop uncommitted input and what the model had queued; restart the VAD."""
        self.uncommitted = 0
        self.ledger.clear()
        self.reset_vad()
