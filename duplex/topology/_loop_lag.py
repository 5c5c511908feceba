"""How late the event loop runs what is due: ``duplex_event_loop_lag_seconds``.

A task sleeps `LAG_PERIOD_S` at a time and observes how much later than asked it woke.
Everything a session process does for its sockets runs on that loop, so a lag is a delay
every frame due then shares: a call that holds the GIL (a worker thread's C code, a
collection) or a burst of work. Measured beside engine figures (tick lateness, step time)
it tells the server's own share of the delay clients see from the engine's.
"""

from __future__ import annotations

from typing import Final

import trio

from duplex.metrics import HistogramCell, MetricsRegistry

__all__ = ["LAG_PERIOD_S", "export_loop_lag", "watch_loop_lag"]

LAG_PERIOD_S: Final = 0.01

LAG_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip

LAG_HISTOGRAM = (
    "duplex_event_loop_lag_seconds",
    "How much later than asked this session process's event loop woke a task sleeping "
    f"{LAG_PERIOD_S} s at a time",
)


def export_loop_lag(registry: MetricsRegistry) -> HistogramCell:
    """The histogram in ``registry`` (``process="session"``); the cell `watch_loop_lag` feeds."""
    name, help_text = LAG_HISTOGRAM
    return registry.histogram(name, help_text, ["process"], LAG_BUCKETS).labels(process="session")


async def watch_loop_lag(cell: HistogramCell, period_s: float = LAG_PERIOD_S) -> None:
    """Observe the loop's lag into ``cell`` forever; run it in a nursery."""
    while True:
        due = trio.current_time() + period_s
        await trio.sleep_until(due)
        cell.observe(max(0.0, trio.current_time() - due))
