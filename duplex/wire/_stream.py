"""The pure half of the stream protocols (Moshi's ``/api/chat``, ``/v1/audio/duplex``).

What a stream projection is (`StreamProjection`), what it may answer a frame with
(an event, a `Later` one, or nothing), and the clock that says how much silence a
continuous output stream owes (`OutputClock`). The socket that drives them is
``duplex.transport``'s `FramedSocket`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, final

from duplex.sessions import ClientEvent, ServerEvent, SessionOptions

__all__ = ["Frame", "Later", "OutputClock", "StreamProjection"]

Frame = str | bytes


@final
@dataclass(frozen=True, slots=True)
class Later:
    """A client event that is due at ``at`` (trio time), not at once."""

    event: ClientEvent
    at: float


class StreamProjection(Protocol):
    """A stream wire protocol, per connection (sans-I/O: time is passed in)."""

    @property
    def initial_options(self) -> SessionOptions | None:
        """Options of the session the protocol opens without a ``session.create``."""
        ...

    @property
    def failed(self) -> bool:
        """A frame broke the stream for good: read no more, the socket is being closed."""
        ...

    def parse(self, data: str | bytes, now: float) -> ClientEvent | Later | None:
        """One frame to its event, a later one, or nothing; raises only ``ProtocolError``."""
        ...

    def frames(self, event: ServerEvent, seq: int | None, now: float) -> list[Frame]:
        """One session event to the frames that carry it (possibly none)."""
        ...

    def due(self, now: float) -> list[Frame]:
        """Frames owed by ``now`` without a session event (silence that keeps the stream)."""
        ...

    def left(self) -> ClientEvent | None:
        """The event the peer's leaving stands for (``None``: nothing to tell)."""
        ...


@final
class OutputClock:
    """How much output audio a continuous stream owes, in samples at ``rate``.

    Started when the stream starts (the handshake). Audio the session sends is
    `sent`; `owed` is what real time asks for, less ``slack``: the model's own
    frames arrive on its tick, so silence is added only once they are late by more
    than that. When the stream falls behind by more than ``max_fill_s`` (the
    process stalled), the clock skips ahead instead of bursting the backlog,
    which would only become latency in the client's player; skipped samples are
    counted.
    """

    def __init__(
        self, rate: int, frame: int, *, slack_frames: int = 2, max_fill_s: float = 0.5
    ) -> None:
        self.rate = rate
        self.frame = frame
        self.slack = slack_frames * frame
        self.max_fill = int(max_fill_s * rate)
        self.started: float | None = None
        self.sent_samples = 0
        self.filled_samples = 0
        self.skipped_samples = 0

    def start(self, now: float) -> None:
        if self.started is None:
            self.started = now

    def sent(self, samples: int) -> None:
        self.sent_samples += samples

    def owed_frames(self, now: float) -> int:
        """Whole frames of silence to send now (0 before `start`)."""
        if self.started is None:
            return 0
        owed = int((now - self.started) * self.rate) - self.slack - self.sent_samples
        if owed > self.max_fill:
            skip = owed - self.frame
            self.skipped_samples += skip
            self.sent_samples += skip
            owed = self.frame
        return max(0, owed // self.frame)
