"""`InputTimes`: when the input an engine output consumed was pushed, on this process's clock.

The per-frame output delay (``duplex_output_delay_seconds``) runs from the push
of input frame k to the write of the audio its tick produced. The engine tags
each output with the input samples it consumed (``SlotOutput.input_samples``),
and the session actor pushed those samples itself, so the actor can find the
push time without the engine keeping any time per frame (and without comparing
clocks of two processes, should the engine run in another one).
"""

from __future__ import annotations

from collections import deque
from typing import final

__all__ = ["InputTimes"]

MAX_CHUNKS = 256
"""Pushes remembered; past this the oldest is forgotten (its samples are long consumed
in any session that keeps up: the engine's queue holds a few dozen frames)."""


@final
class InputTimes:
    """Push times of the input one slot has not consumed yet, by sample count."""

    __slots__ = ("_chunks", "consumed", "pushed")

    def __init__(self) -> None:
        self._chunks: deque[tuple[int, float]] = deque(maxlen=MAX_CHUNKS)
        """(samples pushed up to the end of this chunk, when it was pushed)."""
        self.pushed = 0
        self.consumed = 0

    def push(self, samples: int, now: float) -> None:
        """``samples`` went to the engine at ``now``."""
        if samples > 0:
            self.pushed += samples
            self._chunks.append((self.pushed, now))

    def consume(self, samples: int) -> float | None:
        """An output consumed the next ``samples``; when its last one was pushed.

        ``None``: it consumed none (an underrun, a held prompt tick), or more than
        was pushed since `clear` (input queued before a reset).
        """
        if samples <= 0:
            return None
        if self.consumed + samples > self.pushed:  # pushed before a `clear`: not ours to time
            self.clear()
            return None
        self.consumed += samples
        chunks = self._chunks
        while chunks and chunks[0][0] < self.consumed:
            chunks.popleft()
        return chunks[0][1] if chunks else None

    def clear(self) -> None:
        """The engine dropped the slot's queued input (a reset, a new engine): nothing
        pushed so far will be consumed."""
        self._chunks.clear()
        self.consumed = self.pushed
