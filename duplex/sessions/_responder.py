"""The turn responder: a spoken response of known content for ``turn_policy="turn_based"``.

The loopback model is frame-synchronous: it echoes input 240 ms later whether
or not anyone asked. OpenAI's turn-based Realtime answers only when a response
is requested (``response.create``, or a VAD stop with ``create_response``). So
in ``turn_based`` sessions the machine ignores the model's frames and this pure
component speaks instead: on a request it replays the newest user item, frame by
frame on the machine's clock (one ``chunk_period_ms`` frame per period, the first
at once), as `ModelFrame`\\ s that go through the same projection as model output
(ledger, deltas, epoch fence, ``response.done``).

What it says is known: an audio item's audio, each frame marked ``"[ms]"`` with
its position on the session's input clock (the loopback's marks); a text item's
text as the transcript, with no audio (there is no TTS). Keeping it inside the
machine keeps one owner of session state (no engine round trip, no second
response lifecycle); a real turn-based model replaces it behind ``ModelSignal``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from duplex.pcm import pcm16_to_float

from ._events import ModelFrame, Pcm

__all__ = ["ResponderSource", "TurnResponder"]


@dataclass(frozen=True, slots=True, eq=False)
class ResponderSource:
    """What to say: ``pcm`` (model rate) starting at ``start_ms`` on the input clock, or text."""

    item_id: str
    pcm: Pcm | None
    start_ms: float
    text: str = ""


class TurnResponder:
    """Plays one source at a time as frames due on the machine's clock.

    Args:
        sample_rate: the model rate of the frames.
        frame_ms: one frame's length (the model's ``chunk_period_ms``).
    """

    def __init__(self, sample_rate: int, frame_ms: int) -> None:
        self._rate = sample_rate
        self._frame_ms = frame_ms
        self._frames: deque[ModelFrame] = deque()
        self._started = 0.0
        self._played_ms = 0.0  # audio of the frames released since `_started`
        self._streaming = False
        self._epoch = 0
        self.response_id: str | None = None

    @property
    def active(self) -> bool:
        """Frames are still to come (queued, or a stream not yet finished)."""
        return bool(self._frames) or self._streaming

    @property
    def streaming(self) -> bool:
        """A stream is open: `feed` takes its chunks."""
        return self._streaming

    def start_stream(self, epoch: int, response_id: str, now: float) -> None:
        """Open a stream for ``response_id``; its chunks come with `feed`."""
        self._frames.clear()
        self.response_id = response_id
        self._epoch = epoch
        self._started, self._played_ms = now, 0.0
        self._streaming = True

    def feed(self, pcm: Pcm | bytes, text: str, final: bool, now: float) -> None:
        """Queue one chunk of the open stream (``text`` rides its first frame); ``final``
        ends the stream with an end-of-turn frame."""
        if not self._streaming:
            return
        if not self._frames and self._started + self._played_ms / 1000.0 < now:
            self._started, self._played_ms = now, 0.0  # it ran dry: play on from now
        samples = _float(pcm)
        step = self._rate * self._frame_ms // 1000
        count = -(-samples.size // step)
        for index in range(count):
            chunk = samples[index * step : (index + 1) * step]
            last = final and index == count - 1
            self._frames.append(
                ModelFrame(self._epoch, chunk, text if index == 0 else "", True, last)
            )
        if count == 0 and (text or final):
            self._frames.append(ModelFrame(self._epoch, b"", text, True, final))
        if final:
            self._streaming = False

    def start(self, source: ResponderSource, epoch: int, response_id: str, now: float) -> None:
        """Queue the frames of ``source`` for ``response_id``; the first is due at ``now``."""
        self._frames.clear()
        self.response_id = response_id
        self._streaming = False
        self._started, self._played_ms = now, 0.0
        if source.pcm is None or source.pcm.size == 0:
            text = source.text or f"[{round(source.start_ms)}]"
            self._frames.append(ModelFrame(epoch, b"", text, True, True))
            return
        step = self._rate * self._frame_ms // 1000
        pcm = np.asarray(source.pcm, dtype=np.float32)
        count = -(-pcm.size // step)
        for index in range(count):
            chunk = pcm[index * step : (index + 1) * step]
            mark = f"[{round(source.start_ms + index * self._frame_ms)}]"
            self._frames.append(ModelFrame(epoch, chunk, mark, True, index == count - 1))

    def stop(self) -> int:
        """Drop the frames not yet played; returns how many."""
        dropped = len(self._frames)
        self._frames.clear()
        self._streaming = False
        self.response_id = None
        return dropped

    def deadline(self) -> float | None:
        """When the next frame is due, if any."""
        if not self._frames:
            return None
        return self._started + self._played_ms / 1000.0

    def due(self, now: float) -> list[ModelFrame]:
        """The frames due by ``now``, in order (catching up if ticks came late)."""
        out: list[ModelFrame] = []
        while self._frames and self._started + self._played_ms / 1000.0 <= now:
            frame = self._frames.popleft()
            out.append(frame)
            self._played_ms += len(frame.pcm) / 2 * 1000.0 / self._rate
        if not self._frames and not self._streaming:
            self.response_id = None
        return out


def _float(pcm: Pcm | bytes) -> np.ndarray:
    """Model-rate samples as float32 (PCM16 bytes are scaled to [-1, 1))."""
    if isinstance(pcm, bytes | bytearray):
        return pcm16_to_float(np.frombuffer(pcm, dtype="<i2"))
    return np.asarray(pcm, dtype=np.float32)
