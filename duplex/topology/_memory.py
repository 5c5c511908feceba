"""Giving freed heap memory back to the system now and then (glibc's ``malloc_trim``).

A closed session's objects are freed, but glibc's malloc keeps freed memory in its heap
for reuse and gives back by itself only what lies at the top of the heap. Under session
churn the heap's top stays in use, so a server's RSS stayed at the high-water mark of
every load it had seen and crept up as a new peak came: in a 10-minute soak RSS rose
33 MB from idle to idle while the bytes malloc had handed out rose 0.7 MB and the freed
bytes it held rose 25 MB (docs/reliability.md, "Soak"). Allocator retention, not a leak.
``malloc_trim(0)`` releases every whole free page inside the heap too (``madvise``), so
the RSS follows what is in use. There are two threads per session process, hence at most
two malloc arenas: ``MALLOC_ARENA_MAX`` changes nothing here.

The call runs in a worker thread: ctypes releases the GIL for it, and the event loop's
small objects come from Python's own allocator, not malloc. It holds malloc's lock while
it walks the heap (17-20 ms for a 190 MB heap on the 2-core machine, 88 ms when it gave
back 120 MB), which delays the loop only where it calls malloc meanwhile. Not glibc
(macOS, musl): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Iterator
from typing import Any

import trio

from duplex.logs import get_logger
from duplex.metrics import HistogramCell, MetricsRegistry, Sample, histogram_samples
from duplex.models import Slack, UnitEstimate

from ._engine_client import EngineSet, RemoteEngine

__all__ = ["TRIMS", "export_trim_histogram", "malloc_trim", "trim_memory_every"]

TRIM_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
)  # fmt: skip
"""Seconds one ``malloc_trim(0)`` took (it holds malloc's lock meanwhile)."""

TRIM_HISTOGRAM = (
    "duplex_malloc_trim_seconds",
    "How long each malloc_trim took, per server process (process: session for the server "
    "and each shard, engine for an engine process)",
)

TRIMS = HistogramCell(TRIM_BUCKETS)
"""This process's trims (malloc is per process, and so is this cell). An engine process
sends its counts in its status (`EngineStatus.trims`); a session process exports its own
and, where it exports the engines' figures, theirs (`export_trim_histogram`)."""

_libc: Any = None


def _glibc() -> Any:
    """glibc, if this process runs on it (``None`` otherwise)."""
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.malloc_trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            libc = False
        _libc = libc
    return _libc or None


def malloc_trim() -> bool | None:
    """Give free heap pages back to the system; whether any were (``None``: not glibc)."""
    libc = _glibc()
    return None if libc is None else bool(libc.malloc_trim(0))


async def trim_memory_every(interval_s: float, slack: Slack | None = None) -> None:
    """Forever (until cancelled): `malloc_trim` every ``interval_s`` seconds, off the
    event loop. Returns at once where ``interval_s`` is 0 or this is not glibc.

    With ``slack`` (a process that ticks a realtime engine) each trim waits for a window
    between ticks, as a batch unit does: it holds malloc's lock, which a step's own
    allocations (numpy buffers, tensors) would otherwise wait on.
    """
    if interval_s <= 0 or _glibc() is None:
        return
    log = get_logger(component="memory")
    estimate = UnitEstimate()
    while True:
        await trio.sleep(interval_s)
        if slack is not None:
            await slack.acquire(estimate)
        try:
            started = time.perf_counter()
            released = await trio.to_thread.run_sync(malloc_trim)
            took_s = time.perf_counter() - started
        finally:
            if slack is not None:
                slack.release()
        estimate.record(took_s)
        TRIMS.observe(took_s)
        log.debug("malloc_trim", released=released, took_ms=round(took_s * 1000.0, 1))


def trim_counts() -> tuple[tuple[int, ...], float]:
    """This process's `TRIMS` as plain data (cumulative), for an engine process's status."""
    return tuple(TRIMS.counts), TRIMS.sum


def export_trim_histogram(registry: MetricsRegistry, hub: EngineSet) -> None:
    """``duplex_malloc_trim_seconds`` in ``registry``: this process's trims
    (``process="session"``) and, where ``hub`` exports the engines' figures, each engine
    process's (``process="engine"``, ``engine``), as of its last status."""
    name, help_text = TRIM_HISTOGRAM

    def collect() -> Iterator[Sample]:
        counts, total = trim_counts()
        yield from histogram_samples(name, TRIM_BUCKETS, {"process": "session"}, counts, total)
        if not hub.export_engine_metrics:
            return
        for index, engine in sorted(hub.engines.items()):
            if isinstance(engine, RemoteEngine) and engine.trims is not None:
                labels = {"process": "engine", "engine": str(index)}
                yield from histogram_samples(name, TRIM_BUCKETS, labels, *engine.trims)

    registry.add_collector(name, "histogram", help_text, collect)
