"""The bounded replay journal behind ``session.resume``.

Every journaled server event gets the next ``server_event_seq`` (1, 2, ...).
Entries leave the journal three ways: the client acknowledges them
(``session.event_ack``), they age past ``ttl_s``, or the byte bound pushes the
oldest out. Only the last two lose data a client might still need, so a cursor
that falls behind them gets a `ReplayGap` instead of a silently partial replay.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, final

from ._events import ServerEvent, rebuilt

__all__ = ["EXPIRY_BATCH_S", "Journal", "JournalStatistics", "Replay", "ReplayGap", "event_size"]

EXPIRY_BATCH_S = 1.0
"""Slack on the expiry deadline: entries expire in batches, not one timer per event."""

_OVERHEAD = 160  # envelope, ids and field names of a JSON event, roughly


_CLASSES: list[type] = []
"""Event classes by code: an entry names its class by index, as a type would keep it tracked."""
_CODES: dict[type, int] = {}


def _code(cls: type) -> int:
    code = _CODES.get(cls)
    if code is None:
        code = _CODES[cls] = len(_CLASSES)
        _CLASSES.append(cls)
    return code


def _size(values: tuple[object, ...]) -> int:
    """Approximate wire size in bytes (base64 for bytes fields)."""
    size = _OVERHEAD
    for value in values:
        if isinstance(value, bytes):
            size += (len(value) + 2) // 3 * 4
        elif isinstance(value, str):
            size += len(value)
    return size


def event_size(event: ServerEvent) -> int:
    """Approximate wire size of ``event`` in bytes (base64 for bytes fields)."""
    return _size(tuple(getattr(event, name) for name in event.__slots__))


@final
@dataclass(frozen=True, slots=True)
class JournalStatistics:
    """A snapshot of the journal (trio's ``statistics()`` habit)."""

    entries: int
    bytes: int
    peak_bytes: int
    max_bytes: int
    ttl_s: float
    first_seq: int | None
    last_seq: int
    acked_through: int
    trimmed_by_ack: int
    expired: int
    overflowed: int


@final
@dataclass(frozen=True, slots=True)
class Replay:
    """Every journaled event after the cursor, in seq order."""

    events: tuple[tuple[int, ServerEvent], ...]


@final
@dataclass(frozen=True, slots=True)
class ReplayGap:
    """The cursor is behind data already lost: ``journal_gap`` or ``journal_overflow``."""

    reason: str


_SEQ, _AT, _SIZE, _CLASS = 0, 1, 2, 3  # an entry: (seq, at, size, class code, *fields)


class Journal:
    """Bounded by age and bytes; overflow policy: drop oldest, remembered as a gap.

    Entries are flat tuples of the event's fields, not the event: a streaming
    session journals two events a frame for ``ttl_s``, and as objects they were
    nearly all of a session's growth in objects the cyclic collector tracks (2.7k a
    minute), whose full collections stop the event loop for every session of the
    process. A tuple of strings, bytes and numbers leaves the collector's sight at
    its first collection.

    Args:
        ttl_s: entries older than this are dropped by `expire`.
        max_bytes: `append` drops the oldest entries beyond this many bytes.
    """

    def __init__(self, *, ttl_s: float, max_bytes: int) -> None:
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._entries: deque[tuple[Any, ...]] = deque()
        self._bytes = 0
        self._peak = 0
        self._last_seq = 0
        self._acked_through = 0
        self._lost_through = 0  # highest seq dropped by age or overflow
        self._overflow_through = 0  # highest seq dropped by the byte bound
        self._trimmed = 0
        self._expired = 0
        self._overflowed = 0

    @property
    def last_seq(self) -> int:
        """The seq of the newest journaled event (0 before the first)."""
        return self._last_seq

    def append(self, event: ServerEvent, now: float) -> int:
        """Journal ``event`` and return its seq."""
        self._last_seq += 1
        values = tuple(getattr(event, name) for name in event.__slots__)
        size = _size(values)
        self._entries.append((self._last_seq, now, size, _code(type(event)), *values))
        self._bytes += size
        self._peak = max(self._peak, self._bytes)
        while self._bytes > self._max_bytes and self._entries:
            dropped = self._pop()
            self._overflowed += 1
            self._lost_through = max(self._lost_through, dropped)
            self._overflow_through = max(self._overflow_through, dropped)
        return self._last_seq

    def ack(self, seq: int) -> None:
        """Drop entries up to ``seq``: the client has them."""
        self._acked_through = max(self._acked_through, min(seq, self._last_seq))
        while self._entries and self._entries[0][_SEQ] <= self._acked_through:
            self._pop()
            self._trimmed += 1

    def expire(self, now: float) -> None:
        """Drop entries older than ``ttl_s``."""
        while self._entries and now - self._entries[0][_AT] >= self._ttl_s:
            dropped = self._pop()
            self._expired += 1
            self._lost_through = max(self._lost_through, dropped)

    def next_deadline(self) -> float | None:
        """When to run `expire` next, if anything is journaled.

        ``EXPIRY_BATCH_S`` after the oldest entry's expiry, so that a streaming
        session's timer fires about once a second, not once per event. `expire`
        itself is exact: a resume after ``ttl_s`` never replays an expired entry.
        """
        return self._entries[0][_AT] + self._ttl_s + EXPIRY_BATCH_S if self._entries else None

    def replay_after(self, cursor: int) -> Replay | ReplayGap:
        """Events with seq > ``cursor`` in order, or a gap if some are lost."""
        if cursor > self._last_seq:
            return ReplayGap("journal_gap")
        if cursor < self._lost_through:
            reason = "journal_overflow" if cursor < self._overflow_through else "journal_gap"
            return ReplayGap(reason)
        if cursor < self._acked_through:
            return ReplayGap("journal_gap")  # the client acked what it now asks for again
        return Replay(
            tuple(
                (e[_SEQ], rebuilt(_CLASSES[e[_CLASS]], e[_CLASS + 1 :]))
                for e in self._entries
                if e[_SEQ] > cursor
            )
        )

    def statistics(self) -> JournalStatistics:
        """Sizes, bounds and how many entries left by ack, age and overflow."""
        return JournalStatistics(
            entries=len(self._entries),
            bytes=self._bytes,
            peak_bytes=self._peak,
            max_bytes=self._max_bytes,
            ttl_s=self._ttl_s,
            first_seq=self._entries[0][_SEQ] if self._entries else None,
            last_seq=self._last_seq,
            acked_through=self._acked_through,
            trimmed_by_ack=self._trimmed,
            expired=self._expired,
            overflowed=self._overflowed,
        )

    def _pop(self) -> int:
        """Drop the oldest entry; its seq."""
        entry = self._entries.popleft()
        self._bytes -= entry[_SIZE]
        return entry[_SEQ]
