"""How many TCP connections a process holds, and which one goes when it holds its cap.

Each connection holds a file descriptor. When a process ran out of them (1,100
stalled bodies at the common default of 1,024), ``accept`` failed with ``EMFILE``
and ``/health`` and new sessions were offline until the stalls timed out.
`ConnectionCap` keeps the process below its descriptor limit by a reserve, and
decides what a connection accepted at the cap gets:

1. the connection that has waited longest without work goes (one with no request
   in flight first: a keep-alive or never-spoken socket; then one whose request
   body is still arriving, the slowloris shape), and the new one takes its place,
   as nginx reuses idle keep-alive connections when ``worker_connections`` run out;
2. if every held connection is working (sessions, requests being answered), the new
   one is served from the reserve as *overflow*: ``/health`` and ``/metrics`` are
   answered, anything else gets ``503 server_busy`` and the connection closes;
3. past the overflow's own bound it is closed at once.

Pure bookkeeping (no I/O, no clock): the HTTP boundary (``_http.py``) calls it at
accept and close, the app's first middleware at each request's start, body and end,
and cancels what it is told to evict.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, final

__all__ = [
    "CONNECTION_BYTES",
    "Admission",
    "ConnectionCap",
    "Held",
    "auto_connection_limit",
]

CONNECTION_BYTES: Final = 64 * 1024
"""Memory a held connection is budgeted: 28 KiB of the server's RSS measured per stalled
HTTP body (2,000 at once, CPU-2), plus the kernel's socket buffers."""

CONNECTION_MEMORY_SHARE: Final = 8
"""Connections may hold at most this fraction (1/N) of the machine's memory."""

MIN_RESERVE: Final = 64
"""File descriptors kept free beyond the connections: models, logs, pipes, overflow."""


@final
@dataclass(eq=False, slots=True)
class Held:
    """One accepted connection, as the cap sees it."""

    overflow: bool
    requests: int = 0
    """HTTP requests and WebSockets the app runs on it now."""
    uploading: int = 0
    """Of those, HTTP requests whose body is still arriving."""
    evicted: bool = False
    """Closed to make room: whatever it still asks is not answered."""
    evict: Callable[[], None] | None = field(default=None, repr=False)
    """Set by the I/O edge: ends the connection (its socket closes as its task ends)."""


@final
@dataclass(frozen=True, slots=True)
class Admission:
    """What a newly accepted connection gets."""

    held: Held | None
    """``None``: close it at once (the cap and the overflow are both full)."""
    evicted: Held | None = None
    """The waiting connection that makes room for it (the caller ends it)."""
    evicted_as: str = ""
    """``idle`` (no request in flight) or ``uploading`` (a body still arriving)."""


@final
class ConnectionCap:
    """Connections held against ``limit``, with ``overflow`` more served only ``/health``.

    Args:
        limit: connections served in full at once (>= 1).
        overflow: connections beyond it answered ``/health``/``/metrics`` or 503 (>= 0).
    """

    def __init__(self, limit: int, overflow: int) -> None:
        if limit < 1 or overflow < 0:
            raise ValueError(f"limit must be >= 1 and overflow >= 0, got {limit}, {overflow}")
        self.limit = limit
        self.overflow = overflow
        self.held = 0
        self.overflowing = 0
        # waiting connections, oldest first (the order they began to wait in)
        self._idle: OrderedDict[Held, None] = OrderedDict()
        self._uploading: OrderedDict[Held, None] = OrderedDict()

    def accept(self) -> Admission:
        """A connection was accepted: held, held in an evicted one's place, overflow or none."""
        if self.held < self.limit:
            return Admission(self._hold(Held(overflow=False)))
        for waiting, kind in ((self._idle, "idle"), (self._uploading, "uploading")):
            if waiting:
                evicted, _ = waiting.popitem(last=False)
                self.held -= 1
                evicted.overflow = evicted.evicted = True  # no longer counted against the limit
                self.overflowing += 1
                return Admission(self._hold(Held(overflow=False)), evicted, kind)
        if self.overflowing < self.overflow:
            self.overflowing += 1
            return Admission(Held(overflow=True))
        return Admission(None)

    def release(self, held: Held) -> None:
        """Its socket is closed."""
        if held.overflow:
            self.overflowing -= 1
        else:
            self.held -= 1
            self._idle.pop(held, None)
            self._uploading.pop(held, None)

    def begin(self, held: Held, *, body: bool) -> None:
        """A request (``body``: an HTTP request, whose body arrives next) or a WebSocket starts."""
        held.requests += 1
        held.uploading += body
        self._place(held)

    def body_done(self, held: Held) -> None:
        """One request's body has arrived whole (or will not: the client left)."""
        held.uploading -= 1
        self._place(held)

    def end(self, held: Held, *, body_done: bool) -> None:
        """A request or WebSocket ended (``body_done``: ``False`` if its body never completed)."""
        held.requests -= 1
        if not body_done:
            held.uploading -= 1
        self._place(held)

    def waiting(self) -> tuple[int, int]:
        """Held connections with no request in flight, and with only bodies arriving."""
        return len(self._idle), len(self._uploading)

    def _hold(self, held: Held) -> Held:
        self.held += 1
        self._idle[held] = None
        return held

    def _place(self, held: Held) -> None:
        """Files ``held`` as idle, uploading or working; a connection that starts to wait
        goes to the back of its line."""
        if held.overflow:
            return
        idle = held.requests == 0
        uploading = not idle and held.uploading == held.requests
        if not idle:
            self._idle.pop(held, None)
        elif held not in self._idle:
            self._idle[held] = None
        if not uploading:
            self._uploading.pop(held, None)
        elif held not in self._uploading:
            self._uploading[held] = None


def open_fds() -> int:
    """File descriptors this process holds now (0 where ``/proc`` cannot tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def auto_connection_limit(soft_fds: int, open_now: int, memory_bytes: int) -> tuple[int, int]:
    """The connection limit and the overflow a process can afford: its descriptors less
    those open now and a reserve, and at most 1/`CONNECTION_MEMORY_SHARE` of the memory
    at `CONNECTION_BYTES` each. The overflow is half the reserve."""
    reserve = max(MIN_RESERVE, soft_fds // 16)
    by_fds = soft_fds - open_now - reserve
    by_memory = memory_bytes // CONNECTION_MEMORY_SHARE // CONNECTION_BYTES
    return max(1, min(by_fds, by_memory)), reserve // 2
