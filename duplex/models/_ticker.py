"""What every trio driver of a synchronous batched core shares: the tick grid and the fan-out.

Tick k is scheduled at ``t0 + k * period`` on trio's clock, so the cadence
never drifts and runs under ``MockClock``; a tick whose work ends after the
next tick's time is late and counted, and the loop then runs back to back
until it is on its grid again. Results go to each subscriber's ``send_nowait``
(a bounded memory channel, or a sink straight into an actor's mailbox): a full
subscriber drops the item and counts it, so one slow subscriber never holds up
the tick.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar, final

import trio

H = TypeVar("H", bound=Hashable)
T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Subscriber(Protocol[T_contra]):
    """Where a driver delivers: ``trio.MemorySendChannel`` has this shape.

    ``send_nowait`` raises ``trio.WouldBlock`` when full, and
    ``trio.BrokenResourceError`` / ``trio.ClosedResourceError`` when gone.
    """

    def send_nowait(self, value: T_contra, /) -> None: ...


@final
class Fanout(Generic[H, T]):
    """Per-subscriber bounded channels, with every undelivered item counted."""

    def __init__(self, on_closed: Callable[[H], object]) -> None:
        self.subscribers: dict[H, Subscriber[T]] = {}
        self.delivered = 0
        self.dropped_full = 0
        self.dropped_closed = 0
        self.orphaned = 0
        self._on_closed = on_closed

    def send(self, handle: H, item: T) -> bool:
        """Hand ``item`` to ``handle``'s channel; ``False`` when it was full (dropped).

        A closed channel is dropped too and reported to ``on_closed`` (which detaches
        it); an item for a handle with no subscriber is orphaned.
        """
        channel = self.subscribers.get(handle)
        if channel is None:
            self.orphaned += 1
            return True
        try:
            channel.send_nowait(item)
        except trio.WouldBlock:
            self.dropped_full += 1
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.dropped_closed += 1
            self._on_closed(handle)
        else:
            self.delivered += 1
        return True


def loop_counters(ticker: Ticker, fanout: Fanout[Any, Any]) -> dict[str, int]:
    """The tick and delivery counters every driver's statistics carry, by field name."""
    return {
        "ticks": ticker.ticks,
        "idle_ticks": ticker.idle_ticks,
        "late_ticks": ticker.late_ticks,
        "subscribers": len(fanout.subscribers),
        "delivered": fanout.delivered,
        "dropped_full": fanout.dropped_full,
        "dropped_closed": fanout.dropped_closed,
        "orphaned": fanout.orphaned,
    }


@final
class Ticker:
    """The fixed tick grid: counts ticks, idle ticks (no work) and late ticks."""

    def __init__(self, period_s: float) -> None:
        if period_s <= 0:
            raise ValueError(f"period must be positive, got {period_s}")
        self.period_s = period_s
        self.ticks = 0
        self.idle_ticks = 0
        self.late_ticks = 0
        self.next_at = math.inf
        """When the next tick is due on the grid (trio's clock; ``inf`` before `run`)."""

    async def run(
        self,
        has_work: Callable[[], bool],
        work: Callable[[float], Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Forever: at each tick, ``await work(scheduled_time)`` if ``has_work()``."""
        start = trio.current_time()
        task_status.started()
        tick = 0
        while True:
            scheduled = start + tick * self.period_s
            self.next_at = scheduled
            await trio.sleep_until(scheduled)
            self.next_at = scheduled + self.period_s
            self.ticks += 1
            tick += 1
            if not has_work():
                self.idle_ticks += 1
                continue
            await work(scheduled)
            if trio.current_time() > scheduled + self.period_s:
                self.late_ticks += 1
