"""A tiny energy VAD, used when no model VAD is present.

RMS over fixed frames against ``threshold_rms`` (0.003, vllm-omni's
``overlap_silence_rms``); the frames go through the same `SpeechSegmenter` as the
silero VAD's windows (a loud frame is probability 1), with a minimum run to start
and a hangover to stop, so a click does not start speech and a breath does not end
it. It emits the same `SpeechStarted` / `SpeechStopped` events as the silero VAD.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._events import SpeechStarted, SpeechStopped
from ._segmenter import SegmentStarted, SegmentStopped, ServerVadConfig, SpeechSegmenter

__all__ = ["EnergyVad"]

_NO_SAMPLES = np.zeros(0, dtype=np.float32)
_NO_SAMPLES.flags.writeable = False
_BLOCK_FRAMES = 1024  # frames squared at a time (2 MiB of 20 ms frames at 24 kHz)


class EnergyVad:
    """Streaming; ``audio_ms`` is measured on the clock of the samples fed to it.

    Args:
        sample_rate: rate of the PCM passed to `process`.
        threshold_rms: a frame at or above this RMS is speech.
        frame_ms: analysis frame length.
        min_speech_ms: speech must last this long to start.
        hangover_ms: silence must last this long to stop.
    """

    def __init__(
        self,
        sample_rate: int,
        *,
        threshold_rms: float = 0.003,
        frame_ms: int = 20,
        min_speech_ms: int = 60,
        hangover_ms: int = 300,
    ) -> None:
        self._frame = sample_rate * frame_ms // 1000
        self._frame_ms = frame_ms
        self._loud_energy = threshold_rms * threshold_rms * self._frame  # sum of squares
        self._segmenter = SpeechSegmenter(
            ServerVadConfig(
                prefix_padding_ms=0,  # the machine pads (``vad_prefix_padding_ms``)
                silence_duration_ms=hangover_ms,
                min_speech_ms=min_speech_ms,
            )
        )
        self._pending = _NO_SAMPLES
        self._frames = 0

    @property
    def last_speech_ms(self) -> float:
        """While `speaking`, the end of the latest loud frame: where speech really stopped
        (no hangover)."""
        return self._segmenter.last_speech_end_ms

    @property
    def speaking(self) -> bool:
        """Inside a speech segment."""
        return self._segmenter.speaking

    def process(self, pcm: npt.NDArray[np.float32]) -> list[SpeechStarted | SpeechStopped]:
        """Feed samples; return the speech boundaries they complete, in order."""
        data = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._pending.size:
            data = np.concatenate([self._pending, data])
        frame = self._frame
        whole = data.size // frame
        cut = whole * frame
        # chunks are usually whole frames: then there is no remainder to copy
        self._pending = data[cut:].copy() if cut < data.size else _NO_SAMPLES
        if whole == 0:
            return []
        frames = data[:cut].reshape(whole, frame)
        # ``add.reduce`` is ``sum`` without its Python wrapper; einsum is slower this small.
        # A block of frames at a time, so a large append squares no full-size copy.
        energy: list[float] = []
        for first in range(0, whole, _BLOCK_FRAMES):
            block = np.square(frames[first : first + _BLOCK_FRAMES])
            energy += np.add.reduce(block, axis=1, dtype=np.float64).tolist()
        loud, frame_ms, push = self._loud_energy, self._frame_ms, self._segmenter.push
        events: list[SpeechStarted | SpeechStopped] = []
        end_ms = self._frames * frame_ms
        for frame_energy in energy:
            start_ms, end_ms = end_ms, end_ms + frame_ms
            for found in push(start_ms, end_ms, 1.0 if frame_energy >= loud else 0.0):
                if isinstance(found, SegmentStarted):
                    events.append(SpeechStarted(found.audio_start_ms))
                elif isinstance(found, SegmentStopped):
                    events.append(SpeechStopped(found.audio_end_ms))
        self._frames += whole
        return events
