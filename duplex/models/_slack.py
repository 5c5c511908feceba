"""`Slack`: batch work runs in the gaps between realtime ticks, never across one.

One per process, shared by the realtime tick driver and every request engine
there. The driver reports when a step starts and ends and when the next tick
is due (`step_started`, `step_ended`), or that it has nothing live (`idle`).
A request engine asks for a window before each unit of preemption (one
policy batch, one diffusion step, one TTS sentence): `acquire` lets it in
when no step runs and the unit's estimated cost ends ``margin_s`` before the
next tick. While realtime work is live, one unit runs at a time; with none,
the window is open and units of different engines may overlap.

A unit cannot be stopped mid-kernel, and a tick never waits for one: a unit
that runs past its estimate overlaps the next step (counted as ``overran``;
on a shared device that step runs slower), and its time raises the runner's
estimate, so its next unit waits for a wider window. A unit that
fits no window waits (``deferred`` counts the waits): realtime ticks keep
their deadline and batch work gets what is left (but see `UnitEstimate`:
a runner whose units never fit probes once per horizon).

A unit whose device work runs on a stream below the realtime one
(``beside_steps``: `priority_stream`, on a GPU) needs a window but not one it
fits: it starts between steps and may run on into the next one, whose kernels
the device runs ahead of its own. It may not start during a step: measured on
one H200 beside 64 Moshi-7B sessions, units started at any time took the
images from 0.33x to 0.74x of their rate alone but stretched the step from 32
to 72 ms p99 (the device's priority orders kernel blocks, it does not reserve
the SMs a running unit holds). Work that contends elsewhere (the host's
allocator: `trim_memory_every`) still needs a window it fits.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

import trio

__all__ = ["DEFAULT_MARGIN_S", "Slack", "SlackStatistics", "UnitEstimate"]

DEFAULT_MARGIN_S: Final = 0.002
"""Kept free before each tick: the tick's own wake-up and the unit's hand-off."""


@final
@dataclass(frozen=True, slots=True)
class SlackStatistics:
    """Counters since the slack was made.

    Args:
        units: units let in.
        deferred: times a unit found no window that fits and waited for the next one.
        overran: units still running when the next tick was due.
        steps: realtime steps reported.
        beside: steps that started while a ``beside_steps`` unit ran (it may: not
            ``overran``).
    """

    units: int
    deferred: int
    overran: int
    steps: int
    beside: int = 0


@final
class UnitEstimate:
    """What the next unit of one runner will cost: a high quantile of its recent units.

    High (the 90th percentile of the last 20: the second longest), not the mean,
    because a unit that overruns costs a tick while one that waits costs only
    batch latency; not the longest, because one descheduled unit on a busy host
    would then keep every later one out of windows it fits. Two exceptions keep an outlier
    from starving a runner for good: the runner's first unit is not recorded
    (it pays for lazy initialisation and allocator warm-up), and a time older
    than ``horizon_s`` no longer counts, so a runner whose units fit no window
    sends one probe unit at most every ``horizon_s`` (which overruns, at worst,
    once in that time) and learns its cost again.

    Args:
        window: how many recent units count.
        quantile: which of them is the estimate (1.0: the longest).
        horizon_s: how long a unit's time counts.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        window: int = 20,
        quantile: float = 0.9,
        horizon_s: float = 10.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)
        self._quantile = quantile
        self._horizon_s = horizon_s
        self._clock = clock
        self._warm = False

    def record(self, seconds: float) -> None:
        if not self._warm:
            self._warm = True
            return
        self._recent.append((self._clock(), max(0.0, seconds)))

    @property
    def seconds(self) -> float:
        """0 before the first unit is recorded: it takes the first window that opens."""
        oldest = self._clock() - self._horizon_s
        times = sorted(took for at, took in self._recent if at >= oldest)
        if not times:
            return 0.0
        return times[min(len(times) - 1, int(self._quantile * len(times)))]


@final
class Slack:
    """The windows between one process's realtime steps, handed to batch units.

    Args:
        margin_s: kept free before each tick.
        clock: trio's clock by default (``MockClock`` in tests).
    """

    def __init__(
        self,
        *,
        margin_s: float = DEFAULT_MARGIN_S,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if not margin_s >= 0:
            raise ValueError(f"margin_s must be >= 0, got {margin_s}")
        self.margin_s = margin_s
        self._clock = clock
        self._stepping = False
        self._window_end = math.inf
        """When the next tick is due (``inf``: no realtime work is live)."""
        self._running = 0
        self._running_beside = 0
        self._changed = trio.Event()
        self._units = 0
        self._deferred = 0
        self._overran = 0
        self._steps = 0
        self._beside = 0

    @property
    def stepping(self) -> bool:
        """A realtime step is running now."""
        return self._stepping

    @property
    def realtime(self) -> bool:
        """Realtime work is live: units are serialized and must fit a window."""
        return self._stepping or self._window_end != math.inf

    # the tick driver's side

    def step_started(self) -> None:
        """A realtime step begins: no unit is let in until it ends."""
        self._steps += 1
        if self._running_beside:
            self._beside += 1
        elif self._running:
            self._overran += 1
        self._stepping = True
        self._notify()

    def step_ended(self, next_tick_at: float) -> None:
        """The step is done; the window lasts until ``next_tick_at``."""
        self._stepping = False
        self._window_end = next_tick_at
        self._notify()

    def idle(self) -> None:
        """The driver has nothing live: the window is open until its next step."""
        if self._window_end != math.inf and not self._stepping:
            self._window_end = math.inf
            self._notify()

    # the request engines' side

    def time_left(self, margin_s: float | None = None) -> float:
        """Seconds until the open window closes, ``margin_s`` (the slack's margin by
        default) taken off (``inf``: no realtime work is live; 0 while a step runs)."""
        if not self.realtime:
            return math.inf
        if self._stepping:
            return 0.0
        margin = self.margin_s if margin_s is None else margin_s
        return max(0.0, self._window_end - margin - self._clock())

    def fits(self, estimate_s: float, *, beside_steps: bool = False, elastic: bool = False) -> bool:
        """A unit of ``estimate_s`` may start now (``beside_steps``: whatever its estimate;
        ``elastic``: a unit that ends itself at the window's close, ``estimate_s`` before
        the tick, so it needs no other margin)."""
        if not self.realtime:
            return True
        if self._stepping or self._running:
            return False
        if beside_steps:
            return True
        margin = 0.0 if elastic else self.margin_s
        return self._clock() + estimate_s + margin <= self._window_end

    async def acquire(
        self,
        estimate: UnitEstimate | float,
        *,
        beside_steps: bool = False,
        elastic: bool = False,
    ) -> None:
        """Wait for a window that fits the unit (its runner's `UnitEstimate`, read again at
        each window, or a fixed number of seconds), then hold it until `release`;
        ``beside_steps``: the unit runs below realtime steps on its device, so any window
        will do; ``elastic``: as `fits`. Cancellable while it waits."""
        await trio.lowlevel.checkpoint_if_cancelled()
        deferred = False
        while not self.fits(
            estimate.seconds if isinstance(estimate, UnitEstimate) else estimate,
            beside_steps=beside_steps,
            elastic=elastic,
        ):
            if not deferred and not self._stepping and not self._running:
                self._deferred += 1  # a window is open but too short for this unit
                deferred = True
            await self._changed.wait()
        self._running += 1
        self._running_beside += beside_steps
        self._units += 1

    def release(self, *, beside_steps: bool = False) -> None:
        """The unit is done (acquired with the same ``beside_steps``); the next may start."""
        assert self._running > 0, "release without acquire"
        assert self._running_beside >= beside_steps, "release beside_steps without acquire"
        self._running -= 1
        self._running_beside -= beside_steps
        self._notify()

    def statistics(self) -> SlackStatistics:
        return SlackStatistics(
            units=self._units,
            deferred=self._deferred,
            overran=self._overran,
            steps=self._steps,
            beside=self._beside,
        )

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
