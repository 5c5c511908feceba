"""Admission by engine capacity: a pure counter the session registry consults.

A session beyond capacity is refused with ``resource_exhausted`` and the socket
closes with 1013 (try again later). Capacity returns only when `release` is
called, i.e. when the session's `ReleaseResources` effect has actually been
carried out, not when its socket closes. Every refusal has a `RefusalReason`;
`RefusalLog` decides which refusals get a log line, so a flood does not spam it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import final

from duplex.exceptions import ResourceExhausted

from ._effects import CLOSE_TRY_AGAIN_LATER, CloseConnection, Effect, Send
from ._events import ErrorEvent

__all__ = ["Admission", "AdmissionStatistics", "RefusalLog", "RefusalReason"]


class RefusalReason(Enum):
    """Why a session was refused; the value is the ``reason`` label of
    ``duplex_sessions_refused_total`` and of the log line."""

    STARTING = "starting"
    """No engine runs yet."""
    MAX_SESSIONS = "max_sessions"
    """``server.max_sessions`` sessions are live."""
    SLOTS = "slots"
    """Every engine slot is live or being released (on a GPU the pool is sized by memory)."""
    STEP_TIME = "step_time"
    """The measured step time leaves no room for one more session."""
    VAD = "vad"
    """The shared VAD's stream pool is full (or the VAD is not running)."""
    SLEEPING = "sleeping"
    """The engine sleeps (``POST /v1/omni/sleep``) until it is woken."""


@final
class RefusalLog:
    """Rate limit of refusal log lines: the first refusal of a reason is logged, then at
    most one line per reason every ``interval_s``, carrying how many were not logged.
    A reason is any hashable: a `RefusalReason`, or an access refusal's code.

    Pure: the caller passes trio's time.
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self._interval_s = interval_s
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def note(self, reason: Hashable, now: float) -> int | None:
        """Count one refusal; returns how many went unlogged before it when this one
        should be logged, else ``None``."""
        last = self._last.get(reason)
        if last is not None and now - last < self._interval_s:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return None
        self._last[reason] = now
        return self._suppressed.pop(reason, 0)


@final
@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    """Live sessions, the bound and refusals."""

    live: int
    capacity: int
    peak: int
    admitted: int
    refused: int
    released: int


class Admission:
    """Holds the ids of sessions that own engine resources.

    Args:
        capacity: how many sessions may hold resources at once (engine slots).
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._live: set[str] = set()
        self._peak = 0
        self._admitted = 0
        self._refused = 0
        self._released = 0

    @property
    def bound(self) -> int:
        """The configured bound: engine slots, lowered to ``max_sessions``."""
        return self._capacity

    @property
    def live(self) -> int:
        """Sessions holding a place."""
        return len(self._live)

    def try_admit(self, session_id: str) -> bool:
        """Take a place for ``session_id``; ``False`` (counted) when full."""
        if session_id in self._live:
            return True
        if len(self._live) >= self._capacity:
            self._refused += 1
            return False
        self._live.add(session_id)
        self._admitted += 1
        self._peak = max(self._peak, len(self._live))
        return True

    def release(self, session_id: str) -> None:
        """Give the place back; call after the session's resources are freed."""
        if session_id in self._live:
            self._live.remove(session_id)
            self._released += 1

    def refusal(self, generation: int, event_id: str | None = None) -> list[Effect]:
        """The effects that refuse a socket: one ``resource_exhausted`` error, close 1013."""
        exc = ResourceExhausted(
            f"duplex_session_capacity_exhausted: limit={self._capacity}", event_id=event_id
        )
        return [
            Send(ErrorEvent.from_exception(exc), None, generation),
            CloseConnection(generation, CLOSE_TRY_AGAIN_LATER, "resource_exhausted"),
        ]

    def statistics(self) -> AdmissionStatistics:
        """A frozen snapshot."""
        return AdmissionStatistics(
            live=len(self._live),
            capacity=self._capacity,
            peak=self._peak,
            admitted=self._admitted,
            refused=self._refused,
            released=self._released,
        )
