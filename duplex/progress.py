"""Startup progress: what the server still waits for before it can admit sessions.

The server runs its long startup work (building the ``tiny`` checkpoint,
loading a 7B one, capturing CUDA graphs, loading the VAD) as named `Startup`
steps. ``/health`` answers ``starting`` with `Startup.waiting_for` until none is
left, and the server logs a progress line at an interval meanwhile. Code deep
inside a step that knows more (which CUDA graph bucket it captures) calls
`note`; it finds its step through a context variable, which trio's worker
threads inherit from the task that started them, so a model needs no handle
passed down to it. Outside a step `note` does nothing.

A leaf module (no trio, no other duplex module): every layer may import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import final

__all__ = ["Startup", "note"]

_CURRENT: ContextVar[tuple[Startup, str] | None] = ContextVar("duplex_startup_step", default=None)


@final
class Startup:
    """The named steps still running, each with what it is doing now.

    Args:
        clock: seconds for each step's elapsed time (``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiting: dict[str, tuple[str, float]] = {}
        self.began = clock()
        self.finished: dict[str, float] = {}
        """Each finished step's duration in seconds, in the order they finished."""

    @contextmanager
    def step(self, name: str, detail: str) -> Iterator[None]:
        """Run a step: waited for (with ``detail``) until the block ends, however it ends."""
        if name in self._waiting:
            raise ValueError(f"startup step {name!r} is already running")
        began = self._clock()
        self._waiting[name] = (detail, began)
        token = _CURRENT.set((self, name))
        try:
            yield
        finally:
            _CURRENT.reset(token)
            del self._waiting[name]
            self.finished[name] = self._clock() - began

    def waiting_for(self) -> dict[str, str]:
        """Each running step's current detail (empty once everything is up)."""
        return {name: detail for name, (detail, _) in dict(self._waiting).items()}

    def elapsed(self) -> float:
        """Seconds since this startup began."""
        return self._clock() - self.began

    @property
    def done(self) -> bool:
        return not self._waiting

    def _note(self, name: str, detail: str) -> None:
        entry = self._waiting.get(name)
        if entry is not None:  # a step that ended (an engine rebuilt later) is not reopened
            self._waiting[name] = (detail, entry[1])


def note(detail: str) -> None:
    """Say what the current startup step is doing now (no-op outside a step)."""
    current = _CURRENT.get()
    if current is not None:
        startup, name = current
        startup._note(name, detail)
