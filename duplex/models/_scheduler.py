"""Slot allocation and admission, decided on plain numbers.

Like vllm's scheduler, this object holds logical state only (which slot ids
are free, live or being released, and a window of measured step times); the
runner holds the tensors. It imports no trio, numpy or torch and reads no
clock: durations and the time (trio's clock, from the engine's caller) are
handed to it.

Replay steps (a prompt replay, any prefill: slots that take no input yet) may
run between ticks, in the slack. How many fit a window is decided here too
(`Scheduler.replay_steps`), from the replay steps' own measured times, kept in a
window of their own so they never move admission.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import final

__all__ = ["CapacityLimit", "CapacityReport", "Scheduler", "SchedulerStatistics", "SlotState"]


class SlotState(IntEnum):
    """Life of a slot id: FREE -> LIVE -> RELEASING -> FREE.

    RELEASING holds the id back until the runner has dropped its state, so a
    new owner never sees the previous owner's state.
    """

    FREE = 0
    LIVE = 1
    RELEASING = 2


class CapacityLimit(Enum):
    """What bounds capacity now (see `Scheduler.report`)."""

    POOL = "pool"
    """Nothing in the window is over budget: every slot of the pool may be live."""
    STEP_TIME = "step_time"
    """A batch size in the window ran over budget: capacity stays below it."""
    PROBE = "probe"
    """The over-budget evidence has expired: one session more than it allowed may come in
    and measure that batch size again."""


@final
@dataclass(frozen=True, slots=True)
class CapacityReport:
    """How many slots may be live now and why no more: admission, ``/health`` and
    ``/metrics`` all read this one record.

    Args:
        slots: slots that may be live at once (never below 1).
        live: slots live now.
        free_ids: slot ids free now (an id being released is not free yet).
        limit: what bounds ``slots``.
        over_batch: the smallest batch size measured over budget (``None``: none).
        over_p99_s: that batch size's p99 step time in the window (``None``: expired).
        budget_s: the p99 step time a batch may take.
    """

    slots: int
    live: int
    free_ids: int
    limit: CapacityLimit
    over_batch: int | None
    over_p99_s: float | None
    budget_s: float

    @property
    def admits(self) -> bool:
        """One more slot may go live: an id is free and ``live < slots``."""
        return self.free_ids > 0 and self.live < self.slots


@final
@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """Snapshot of the slot pool and the step-time window (seconds)."""

    max_slots: int
    live: int
    releasing: int
    free: int
    capacity: int
    limit: CapacityLimit
    budget_s: float
    window_steps: int
    last_step_s: float | None
    p50_step_s: float | None
    p99_step_s: float | None
    max_step_s: float | None


_REPLAY_RECENT = 16
"""Replay steps of one batch size that the estimate reads (`Scheduler.replay_steps`)."""
_REPLAY_HORIZON_S = 10.0
"""How long a replay step's time counts (`Scheduler.replay_steps`)."""


def _nearest_rank(sorted_values: list[float], q: float) -> float:
    """The q-quantile by nearest rank: deterministic and never interpolated."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@final
class Scheduler:
    """Decides which slot a newcomer gets and whether it may come in at all.

    Args:
        max_slots: size of the slot pool.
        frame_period_s: seconds per tick.
        phases: the slots are stepped in this many groups per frame period (see
            ``ModelSpec.tick_phases``): a step has ``frame_period_s / phases`` and
            holds about ``1 / phases`` of the live slots.
        deadline_fraction: share of a step's period it may take at p99.
        window: most recent steps the p99 is computed over (bounded deque).
        window_s: steps older than this (on the clock the engine passes) are forgotten,
            so a stall stops counting even when nothing runs.
        min_samples: steps needed at one batch size before its p99 counts.
        min_slow: over-budget steps needed at one batch size before it counts as over
            budget: one stall (a GC pause, a late page fault) is never evidence.
    """

    def __init__(
        self,
        max_slots: int,
        frame_period_s: float,
        *,
        phases: int = 1,
        deadline_fraction: float = 0.8,
        window: int = 512,
        window_s: float = 30.0,
        min_samples: int = 16,
        min_slow: int = 2,
    ) -> None:
        if max_slots <= 0:
            raise ValueError("max_slots must be positive")
        if frame_period_s <= 0 or phases <= 0:
            raise ValueError("frame_period_s and phases must be positive")
        if not 0 < deadline_fraction <= 1:
            raise ValueError("deadline_fraction must be in (0, 1]")
        if window <= 0 or min_samples <= 0 or min_slow <= 0 or not window_s > 0:
            raise ValueError("window, window_s, min_samples and min_slow must be positive")
        self._max_slots = max_slots
        self._budget_s = deadline_fraction * frame_period_s / phases
        self._phases = phases
        self._window_s = window_s
        self._min_samples = min_samples
        self._min_slow = min_slow
        self._states = [SlotState.FREE] * max_slots
        self._free: list[int] = list(range(max_slots))  # a heap: lowest id first
        self._live = 0
        self._releasing = 0
        self._steps: deque[tuple[int, float, float]] = deque(maxlen=window)
        """(batch size, duration, time recorded)."""
        self._replays: deque[tuple[int, float, float]] = deque(maxlen=window)
        """Replay steps: (batch size, duration, time recorded)."""
        self._now = -math.inf
        self._over: int | None = None
        """The smallest batch size last found over budget; forgotten once it measures fine."""

    @property
    def budget_s(self) -> float:
        """The p99 step time a batch may take: ``deadline_fraction * frame_period_s / phases``."""
        return self._budget_s

    def state(self, slot: int) -> SlotState:
        """The state of one slot id."""
        return self._states[slot]

    def report(self, now: float | None = None) -> CapacityReport:
        """How many slots may be live at once, by measured step time; ``now``: the clock
        the steps were recorded on (``None``: the latest time seen).

        The rule: over the steps of the last ``window_s`` (at most ``window`` of them),
        a batch size b is over budget when it has ``min_samples`` steps, its p99
        exceeds ``deadline_fraction * frame_period / phases`` and at least ``min_slow``
        of its steps do. Step cost grows with batch size, so the smallest over-budget
        size b* caps capacity at ``phases * (b* - 1)`` (with phases the engine balances
        the groups, so n live slots make batches of at most ``ceil(n / phases)``).
        Sizes not yet measured are presumed to fit. Recovery, so nothing locks out:

        - capacity is never below 1: one session may always run (the probe), and
          its steps are the new evidence;
        - when b*'s evidence leaves the window, capacity is one more than b* allowed
          (a probe of b*), not the whole pool; b* is forgotten once ``min_samples``
          steps at b* fit, and capped again once ``min_slow`` do not.
        """
        now = self._now if now is None else max(now, self._now)
        over, p99 = self._over_budget(now)
        if over is not None and (self._over is None or over <= self._over):
            limit, slots = CapacityLimit.STEP_TIME, max(1, self._phases * (over - 1))
        elif self._over is not None:  # its evidence expired: probe it with one more
            over, p99, limit = self._over, None, CapacityLimit.PROBE
            slots = self._phases * (over - 1) + 1
        else:
            limit, slots = CapacityLimit.POOL, self._max_slots
        return CapacityReport(
            slots=min(slots, self._max_slots),
            live=self._live,
            free_ids=len(self._free),
            limit=limit,
            over_batch=over,
            over_p99_s=p99,
            budget_s=self._budget_s,
        )

    def capacity(self, now: float | None = None) -> int:
        """How many slots may be live at once (`report`'s ``slots``)."""
        return self.report(now).slots

    def can_admit(self, now: float | None = None) -> bool:
        """A slot id is free and one more live slot stays within `capacity`."""
        return self.report(now).admits

    def allocate(self, now: float | None = None) -> int | None:
        """Take the lowest free slot id, or ``None`` when `can_admit` says no."""
        if not self.can_admit(now):
            return None
        slot = heapq.heappop(self._free)
        self._states[slot] = SlotState.LIVE
        self._live += 1
        return slot

    def release(self, slot: int) -> None:
        """LIVE -> RELEASING: the slot stops running; its id is held until `free`."""
        self._expect(slot, SlotState.LIVE)
        self._states[slot] = SlotState.RELEASING
        self._live -= 1
        self._releasing += 1

    def free(self, slot: int) -> None:
        """RELEASING -> FREE, once the runner has reset the slot's state."""
        self._expect(slot, SlotState.RELEASING)
        self._states[slot] = SlotState.FREE
        self._releasing -= 1
        heapq.heappush(self._free, slot)

    def record_step(self, batch_size: int, duration_s: float, now: float | None = None) -> None:
        """Add one measured step taken at ``now`` (``None``: the latest time seen).

        Warm-up steps (graph capture, first use) must not be recorded: they measure
        the capture, not the batch.
        """
        if batch_size <= 0 or duration_s < 0:
            raise ValueError("batch_size must be positive and duration_s non-negative")
        if now is not None:
            self._now = max(self._now, now)
        self._steps.append((batch_size, duration_s, self._now))
        if duration_s <= self._budget_s and batch_size != self._over:
            return  # no new evidence either way: skip the scan of the window
        over, _ = self._over_budget(self._now)
        if over is not None:
            self._over = over if self._over is None else min(over, self._over)
        elif batch_size == self._over and self._fits(batch_size, self._now):
            self._over = None

    def record_replay_step(
        self, batch_size: int, duration_s: float, now: float | None = None
    ) -> None:
        """Add one measured replay step over ``batch_size`` replaying slots, taken at ``now``
        (``None``: the latest time seen): one run between ticks, or a tick whose every
        slot replayed. Kept apart from the admission window: a replay step between ticks
        skips the codec, and its batch is not the tick's."""
        if batch_size <= 0 or duration_s < 0:
            raise ValueError("batch_size must be positive and duration_s non-negative")
        if now is not None:
            self._now = max(self._now, now)
        self._replays.append((batch_size, duration_s, self._now))

    def replay_step_s(self, batch_size: int) -> float | None:
        """The window a replay step over ``batch_size`` slots needs: its estimate (see
        `replay_steps`), or before any replay step is measured, half the tick steps' bound
        (the probe's window); ``None``: nothing measured at all."""
        estimate = self._replay_estimate(batch_size)
        if estimate is not None:
            return estimate
        bound = self._tick_bound(batch_size)
        return None if bound is None else bound / 2

    def replay_steps(self, batch_size: int, time_s: float, limit: int) -> int:
        """How many replay steps over ``batch_size`` slots fit in ``time_s`` seconds (at
        most ``limit``; 0 with nothing to replay or no time).

        The rule: ``floor(time_s / estimate)``, the estimate being the 90th percentile
        (nearest rank) of the last `_REPLAY_RECENT` replay steps of the smallest measured
        batch size at least ``batch_size`` (more rows never cost less), else of the
        largest smaller one scaled by rows (an upper bound: a step's fixed cost does not
        grow). High, not the mean: a step that overruns its window costs every live
        session a late tick, one that stops short costs only the replaying sessions a few
        milliseconds. A replay step older than `_REPLAY_HORIZON_S` no longer counts, so
        one slow step (a busy host) cannot keep replays out of every window for good.
        With none measured, the tick steps of that batch size or more bound one (a tick
        also runs the codec): as many as that bound fits, or else one *probe* step, the
        first evidence, when ``time_s`` is at least half the bound (it overruns its
        window by at most that half, once a horizon); with no tick step either, one probe.
        """
        if batch_size <= 0 or limit <= 0 or not time_s > 0:
            return 0
        estimate = self._replay_estimate(batch_size)
        if estimate is None:
            bound = self._tick_bound(batch_size)
            if bound is None or bound <= 0 or math.isinf(time_s):
                return 1
            fits = min(limit, int(time_s / bound))
            return fits or int(time_s >= bound / 2)
        if estimate <= 0 or math.isinf(time_s):
            return limit
        return min(limit, int(time_s / estimate))

    def _replay_estimate(self, batch_size: int) -> float | None:
        """`replay_steps`'s estimate from measured replay steps (``None``: none yet)."""
        oldest = self._now - _REPLAY_HORIZON_S
        replays = [(b, d) for b, d, at in self._replays if at >= oldest]
        sizes = {b for b, _ in replays}
        if not sizes:
            return None
        above = [b for b in sizes if b >= batch_size]
        size = min(above) if above else max(sizes)
        recent = [d for b, d in replays if b == size][-_REPLAY_RECENT:]
        p90 = _nearest_rank(sorted(recent), 0.9)
        return p90 if above else p90 * batch_size / size

    def _tick_bound(self, batch_size: int) -> float | None:
        """The 90th percentile of the recent tick steps of the smallest measured batch size
        at least ``batch_size`` (``None``: none)."""
        above = [b for b, _, _ in self._steps if b >= batch_size]
        if not above:
            return None
        size = min(above)
        recent = [d for b, d, _ in self._steps if b == size][-_REPLAY_RECENT:]
        return _nearest_rank(sorted(recent), 0.9)

    def statistics(self, now: float | None = None) -> SchedulerStatistics:
        """Snapshot of the pool and of step times over the window."""
        report = self.report(now)
        durations = sorted(d for _, d, _ in self._recent(self._now if now is None else now))
        return SchedulerStatistics(
            max_slots=self._max_slots,
            live=self._live,
            releasing=self._releasing,
            free=len(self._free),
            capacity=report.slots,
            limit=report.limit,
            budget_s=self._budget_s,
            window_steps=len(durations),
            last_step_s=self._steps[-1][1] if self._steps else None,
            p50_step_s=_nearest_rank(durations, 0.5) if durations else None,
            p99_step_s=_nearest_rank(durations, 0.99) if durations else None,
            max_step_s=durations[-1] if durations else None,
        )

    def _recent(self, now: float) -> list[tuple[int, float, float]]:
        """The window's steps recorded within ``window_s`` of ``now``."""
        oldest = now - self._window_s
        return [step for step in self._steps if step[2] >= oldest]

    def _by_batch(self, now: float) -> dict[int, list[float]]:
        by_batch: dict[int, list[float]] = {}
        for batch, duration, _ in self._recent(now):
            by_batch.setdefault(batch, []).append(duration)
        return by_batch

    def _over_budget(self, now: float) -> tuple[int | None, float | None]:
        """The smallest batch size over budget in the window, and its p99."""
        by_batch = self._by_batch(now)
        for batch in sorted(by_batch):
            durations = sorted(by_batch[batch])
            if len(durations) < self._min_samples:
                continue
            p99 = _nearest_rank(durations, 0.99)
            slow = sum(d > self._budget_s for d in durations)
            if p99 > self._budget_s and slow >= self._min_slow:
                return batch, p99
        return None, None

    def _fits(self, batch: int, now: float) -> bool:
        """``batch`` has ``min_samples`` steps in the window and is not over budget."""
        durations = self._by_batch(now).get(batch, [])
        slow = sum(d > self._budget_s for d in durations)
        return len(durations) >= self._min_samples and slow < self._min_slow

    def _expect(self, slot: int, state: SlotState) -> None:
        if not 0 <= slot < self._max_slots:
            raise ValueError(f"slot {slot} is outside the pool of {self._max_slots}")
        if self._states[slot] is not state:
            raise ValueError(f"slot {slot} is {self._states[slot].name}, not {state.name}")
