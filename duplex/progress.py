"""Startup progress: what the server still waits for before it can admit sessions.

The server runs its long startup work (building the ``tiny`` checkpoint,
loading a 7B one, capturing CUDA graphs, loading the VAD) as named `Startup`
steps. ``/health`` answers ``starting`` with `Startup.waiting_for` until none is
left, and the server logs a progress line at an interval meanwhile. Code deep
inside a step that knows more (which CUDA graph bucket it captures) calls
`note`; it finds its step through a context variable, which trio's worker
threads inherit from the task that started them, so a model needs no handle
passed down to it. Outside a step `note` does nothing.

On a terminal the waiting shows as a `TerminalBar` instead of the periodic lines:
one line redrawn in place (the running steps, a bar where a step said how far it
is), which log lines written meanwhile push up (`write_above`, used by the
log stream) rather than break.

A leaf module (no trio, no other duplex module): every layer may import it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO, final

__all__ = ["Startup", "TerminalBar", "active_bar", "note", "render_line"]

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
        self._fraction: dict[str, tuple[int, int]] = {}
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
            self._fraction.pop(name, None)
            self.finished[name] = self._clock() - began

    def waiting_for(self) -> dict[str, str]:
        """Each running step's current detail (empty once everything is up)."""
        return {name: detail for name, (detail, _) in dict(self._waiting).items()}

    def fractions(self) -> dict[str, tuple[int, int]]:
        """Each running step's ``(done, total)``, where its last `note` gave one."""
        return dict(self._fraction)

    def elapsed(self) -> float:
        """Seconds since this startup began."""
        return self._clock() - self.began

    @property
    def done(self) -> bool:
        return not self._waiting

    def _note(self, name: str, detail: str, fraction: tuple[int, int] | None) -> None:
        entry = self._waiting.get(name)
        if entry is not None:  # a step that ended (an engine rebuilt later) is not reopened
            self._waiting[name] = (detail, entry[1])
            if fraction is None:
                self._fraction.pop(name, None)
            else:
                self._fraction[name] = fraction


def note(detail: str, *, done: int | None = None, total: int | None = None) -> None:
    """Say what the current startup step is doing now (no-op outside a step); ``done`` of
    ``total`` (both or neither): how far it is, drawn as a bar on a terminal."""
    if (done is None) != (total is None):
        raise ValueError("note: give both done and total, or neither")
    current = _CURRENT.get()
    if current is not None:
        startup, name = current
        fraction = None if done is None or total is None else (done, total)
        startup._note(name, detail, fraction)


SPINNER = "|/-\\"
BAR_CELLS = 20


def render_line(startup: Startup, width: int, frame: int = 0) -> str:
    """The terminal's one status line: elapsed time and each running step (a bar where it
    said how far it is), cut to ``width`` columns; ``frame`` turns the spinner."""
    parts = []
    fractions = startup.fractions()
    for name, detail in startup.waiting_for().items():
        fraction = fractions.get(name)
        if fraction is None:
            parts.append(f"{name}: {detail}")
            continue
        done, total = fraction
        filled = 0 if total <= 0 else min(BAR_CELLS, BAR_CELLS * done // total)
        bar = "#" * filled + "-" * (BAR_CELLS - filled)
        parts.append(f"{name}: [{bar}] {done}/{total} {detail}")
    spin = SPINNER[frame % len(SPINNER)]
    line = f"{spin} starting {startup.elapsed():.0f}s  " + " | ".join(parts)
    return line if len(line) <= width else line[: max(0, width - 1)] + "~"


_ACTIVE: TerminalBar | None = None


def active_bar() -> TerminalBar | None:
    """The bar drawn on this process's terminal now, if any (the log stream asks)."""
    return _ACTIVE


@final
class TerminalBar:
    """One status line redrawn in place on a terminal; lines written meanwhile go above it.

    Args:
        stream: the terminal (``sys.stderr``).
    """

    CLEAR = "\r\x1b[K"  # carriage return, erase to the end of the line

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.line = ""
        self._lifted = False
        """A line is being written above: the bar is erased until it ends."""

    def width(self) -> int:
        return shutil.get_terminal_size((80, 24)).columns

    def __enter__(self) -> TerminalBar:
        global _ACTIVE
        _ACTIVE = self
        return self

    def __exit__(self, *_: object) -> None:
        global _ACTIVE
        _ACTIVE = None
        if not self._lifted:
            self.stream.write(self.CLEAR)
            self.stream.flush()
        self.line = ""

    def draw(self, line: str) -> None:
        self.line = line
        if not self._lifted:
            self.stream.write(self.CLEAR + line)
            self.stream.flush()

    def write_above(self, text: str) -> int:
        """Write ``text`` where the bar is; once a line ends, draw the bar again below it
        (``print`` writes a line and its newline separately)."""
        if not self.line:
            return self.stream.write(text)
        if not self._lifted:
            self.stream.write(self.CLEAR)
            self._lifted = True
        written = self.stream.write(text)
        if text.endswith("\n"):
            self._lifted = False
            self.stream.write(self.line)
            self.stream.flush()
        return written
