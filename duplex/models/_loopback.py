"""The built-in deterministic ``loopback`` model: echoes each slot's audio after a delay.

It runs through the same engine interface real models use, so sessions,
fencing, video delivery and admission are testable end to end without a
model. State lives in arrays indexed by slot id, and one tick's audio is a
handful of vectorised numpy operations over the live slots.
"""

from __future__ import annotations

from typing import final

import numpy as np
import numpy.typing as npt

from duplex.exceptions import ConfigError

from ._interface import FrameOutput, ModelSpec, StepOutput, StepPlan

__all__ = ["LOOPBACK_SPEC", "LoopbackRunner"]

LOOPBACK_SPEC = ModelSpec(
    name="loopback",
    supports_video_input=True,
    supports_model_native_turn_policy=True,
    max_slots=256,
    tick_phases=4,
    steps_inline=True,
)
"""Loopback decides speaking/end-of-turn itself, so the ``model`` turn policy is usable.
Its rows are independent (no batching gain), so its slots step in 4 phase groups, 20 ms
apart: each sub-tick sends a quarter of the outputs. Its steps are copies, so they run on
the event loop."""


@final
class LoopbackRunner:
    """Per slot, output frame t is input frame t - delay; silence before that.

    ``speaking`` is true when the echoed frame's RMS exceeds ``speech_threshold``;
    the first speaking frame of each run, and every speaking frame at a multiple
    of ``mark_every_ms`` of the stream, carries the text mark ``"[ms]"``, the
    audio-clock position of the echoed input frame (a few marks a second, as a
    speech model emits a few words a second); ``end_of_turn`` is
    set on the first frame after speaking stops. Video frames are consumed as
    they arrive and reported.

    Args:
        spec: sample rate, frame size and slot count.
        delay_ms: echo delay, a whole number of frames (default 240 ms: 3 frames).
        speech_threshold: RMS above which an echoed frame counts as speech.
        mark_every_ms: spacing of the text marks within a run of speech.

    Raises:
        ConfigError: the delay is negative or not a multiple of the frame period.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        delay_ms: int = 240,
        speech_threshold: float = 0.003,
        mark_every_ms: int = 400,
    ) -> None:
        if delay_ms < 0 or delay_ms % spec.frame_ms:
            raise ConfigError(
                f"loopback delay_ms must be a non-negative multiple of {spec.frame_ms}, "
                f"got {delay_ms}"
            )
        if mark_every_ms <= 0 or mark_every_ms % spec.frame_ms:
            raise ConfigError(
                f"loopback mark_every_ms must be a positive multiple of {spec.frame_ms}, "
                f"got {mark_every_ms}"
            )
        self._mark_every_ms = mark_every_ms
        self._spec = spec
        self._delay = delay_ms // spec.frame_ms
        self._threshold = speech_threshold
        depth = max(self._delay, 1)
        self._ring = np.zeros((spec.max_slots, depth, spec.frame_samples), dtype=np.float32)
        self._ring_pos = np.full((spec.max_slots, depth), -1, dtype=np.int64)
        self._head = np.zeros(spec.max_slots, dtype=np.int64)
        self._speaking = [False] * spec.max_slots  # read and set per row in `execute`

    @property
    def spec(self) -> ModelSpec:
        """The loopback spec this runner was built for."""
        return self._spec

    @property
    def delay_frames(self) -> int:
        """Echo delay in frames."""
        return self._delay

    def reset_slot(self, slot: int) -> None:
        """Empty one slot's delay line; other rows are untouched."""
        self._ring[slot] = 0.0
        self._ring_pos[slot] = -1
        self._head[slot] = 0
        self._speaking[slot] = False

    def execute(self, plan: StepPlan) -> StepOutput:
        """Echo one frame per live slot; the audio is vectorised over the batch."""
        inputs = plan.inputs
        frame_samples = self._spec.frame_samples
        batch = np.zeros((len(inputs), frame_samples), dtype=np.float32)
        for row, item in enumerate(inputs):
            if item.frame is not None:
                batch[row] = item.frame
        slots = np.array([item.slot for item in inputs], dtype=np.int64)
        positions = np.array([item.position for item in inputs], dtype=np.int64)
        echoed, echoed_pos = self._delay_line(slots, batch, positions)
        # np.mean's own sum and divide, without its Python-level wrapper (same bits)
        power = np.add.reduce(np.square(echoed, dtype=np.float64), axis=1) / frame_samples
        rms = np.sqrt(power).tolist()
        # The flags are per row, next to the FrameOutput each row needs anyway: numpy
        # calls on a batch of a few rows cost more than these Python comparisons.
        threshold = self._threshold
        rate = self._spec.sample_rate
        every = self._mark_every_ms
        was_speaking = self._speaking
        outputs = []
        for item, pcm, level, pos in zip(inputs, echoed, rms, echoed_pos.tolist(), strict=True):
            slot = item.slot
            speaking = level > threshold and pos >= 0
            was = was_speaking[slot]
            was_speaking[slot] = speaking
            mark_ms = pos * 1000 // rate
            marked = speaking and (not was or mark_ms % every == 0)
            video = item.video
            outputs.append(
                FrameOutput(
                    slot,
                    pcm,
                    f"[{mark_ms}]" if marked else "",
                    speaking,
                    was and not speaking,
                    tuple(v.frame_id for v in video) if video else (),
                    max(v.pts_ms for v in video) if video else None,
                )
            )
        return StepOutput(tuple(outputs))

    def _delay_line(
        self,
        slots: npt.NDArray[np.int64],
        batch: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Swap this tick's frames into each slot's ring and take out the oldest."""
        if self._delay == 0:
            return batch, positions
        head = self._head[slots]
        echoed = self._ring[slots, head]  # fancy indexing copies: no .copy() needed
        echoed_pos = self._ring_pos[slots, head]
        self._ring[slots, head] = batch
        self._ring_pos[slots, head] = positions
        self._head[slots] = (head + 1) % self._delay
        return echoed, echoed_pos
