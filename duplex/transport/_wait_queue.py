"""Sockets that wait for a free slot instead of being refused (``server.chat_wait_queue``).

Kyutai's and NVIDIA's Moshi servers hold every client's socket until their one
conversation ends, then send the next one its handshake; their web UI says
"Waiting for a slot" meanwhile. duplex refuses a full server's ``/api/chat``
with 1013 unless this queue is configured: then up to ``size`` sockets wait, first
come first served, and each gets its session (and so its handshake) as soon as
admission has room. One more is refused with 1013, as without the queue.

Only the head of the queue asks for room, every ``poll_s``: capacity changes for
several reasons (a session ends, the engine's measured step time recovers, an
engine restarts), and the hub's own figures say when there is room, so polling
them is both simpler and more complete than listening for one kind of change.
A waiter that goes (its peer left, the server stops) leaves the queue at once:
its task is cancelled, and trio's `Lock` is fair, so the order holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, final

import trio

__all__ = ["WaitQueue", "WaitQueueFull", "WaitQueueStatistics"]

POLL_S: Final = 0.08
"""How often the head of the queue looks for room: one model frame."""


class WaitQueueFull(Exception):
    """``size`` sockets are waiting already."""


@final
@dataclass(frozen=True, slots=True)
class WaitQueueStatistics:
    """What the queue did since the server started."""

    size: int
    waiting: int
    peak_waiting: int
    admitted: int
    """Waiters that got room (their session then opened, or failed on its own)."""
    refused: int
    """Sockets refused because ``size`` were waiting."""
    left: int
    """Waiters that went before they got room (the peer left, the server stopped)."""


@final
class WaitQueue:
    """A bounded, fair line of sockets waiting for room (see the module docstring).

    Args:
        size: most sockets waiting at once (at least 1).
        poll_s: how often the head looks for room.
    """

    def __init__(self, size: int, *, poll_s: float = POLL_S) -> None:
        if size < 1:
            raise ValueError(f"a wait queue holds at least one socket, got {size}")
        self.size = size
        self.poll_s = poll_s
        self._lock = trio.Lock()
        self._waiting = 0
        self._peak = 0
        self._admitted = 0
        self._refused = 0
        self._left = 0

    @property
    def waiting(self) -> int:
        """Sockets in the queue now."""
        return self._waiting

    def statistics(self) -> WaitQueueStatistics:
        return WaitQueueStatistics(
            self.size, self._waiting, self._peak, self._admitted, self._refused, self._left
        )

    async def wait(self, has_room: Callable[[], bool], take: Callable[[], Awaitable[bool]]) -> None:
        """Wait in line; at the head, call ``take()`` whenever ``has_room()`` says so, until
        it returns true (it took the room, or failed for good). The next waiter asks
        only then: ``take`` losing a race for the room keeps its place at the head.

        Raises:
            WaitQueueFull: ``size`` sockets are waiting already (counted as refused).
        """
        if self._waiting >= self.size:
            self._refused += 1
            raise WaitQueueFull(f"{self.size} sockets are waiting already")
        self._waiting += 1
        self._peak = max(self._peak, self._waiting)
        done = False
        try:
            async with self._lock:
                while not (has_room() and await take()):
                    await trio.sleep(self.poll_s)
                done = True
                self._admitted += 1
        finally:
            self._waiting -= 1
            if not done:
                self._left += 1
