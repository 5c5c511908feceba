"""Slot allocation and admission, decided on plain numbers.

Like vllm's scheduler, this object holds logical state only (which slot ids
are free, live or being released, and a window of measured step times); the
runner holds the tensors. It imports no trio, numpy or torch and reads no
clock: durations are handed to it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import final

__all__ = ["Scheduler", "SchedulerStatistics", "SlotState"]


class SlotState(IntEnum):
    """Life of a slot id: FREE -> LIVE -> RELEASING -> FREE.

    RELEASING holds the id back until the runner has dropped its state, so a
    new owner never sees the previous owner's state.
    """

    FREE = 0
    LIVE = 1
    RELEASING = 2


@final
@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """Snapshot of the slot pool and the step-time window (seconds)."""

    max_slots: int
    live: int
    releasing: int
    free: int
    capacity: int
    budget_s: float
    window_steps: int
    last_step_s: float | None
    p50_step_s: float | None
    p99_step_s: float | None
    max_step_s: float | None


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
        window: how many recent steps the p99 is computed over (bounded deque).
        min_samples: steps needed at one batch size before its p99 counts.
    """

    def __init__(
        self,
        max_slots: int,
        frame_period_s: float,
        *,
        phases: int = 1,
        deadline_fraction: float = 0.8,
        window: int = 512,
        min_samples: int = 16,
    ) -> None:
        if max_slots <= 0:
            raise ValueError("max_slots must be positive")
        if frame_period_s <= 0 or phases <= 0:
            raise ValueError("frame_period_s and phases must be positive")
        if not 0 < deadline_fraction <= 1:
            raise ValueError("deadline_fraction must be in (0, 1]")
        if window <= 0 or min_samples <= 0:
            raise ValueError("window and min_samples must be positive")
        self._max_slots = max_slots
        self._budget_s = deadline_fraction * frame_period_s / phases
        self._phases = phases
        self._min_samples = min_samples
        self._states = [SlotState.FREE] * max_slots
        self._free: list[int] = list(range(max_slots))  # a heap: lowest id first
        self._live = 0
        self._releasing = 0
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)

    @property
    def budget_s(self) -> float:
        """The p99 step time a batch may take: ``deadline_fraction * frame_period_s / phases``."""
        return self._budget_s

    def state(self, slot: int) -> SlotState:
        """The state of one slot id."""
        return self._states[slot]

    def capacity(self) -> int:
        """How many slots may be live at once, by measured step time.

        The rule: capacity is the largest n <= max_slots such that no batch
        size b <= n has a p99 step time (over at least ``min_samples`` steps in
        the window) above ``deadline_fraction * frame_period``. Step cost grows
        with batch size, so the smallest over-budget size b* caps capacity at
        b* - 1. Sizes not yet measured are presumed to fit: capacity is probed
        upward one admission at a time, and an over-budget size ages out of the
        window once smaller batches have run ``window`` steps. With phases, the
        engine balances the groups (sizes differ by at most one), so n live
        slots make batches of at most ``ceil(n / phases)``: capacity is
        ``phases * (b* - 1)``.
        """
        by_batch: dict[int, list[float]] = {}
        for batch, duration in self._steps:
            by_batch.setdefault(batch, []).append(duration)
        capacity = self._max_slots
        for batch in sorted(by_batch):
            durations = by_batch[batch]
            if batch > capacity or len(durations) < self._min_samples:
                continue
            if _nearest_rank(sorted(durations), 0.99) > self._budget_s:
                capacity = min(capacity, self._phases * (batch - 1))
                break
        return capacity

    def can_admit(self) -> bool:
        """A slot id is free and one more live slot stays within `capacity`."""
        return bool(self._free) and self._live < self.capacity()

    def allocate(self) -> int | None:
        """Take the lowest free slot id, or ``None`` when `can_admit` says no."""
        if not self.can_admit():
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

    def record_step(self, batch_size: int, duration_s: float) -> None:
        """Add one measured step; the window keeps the most recent ones."""
        if batch_size <= 0 or duration_s < 0:
            raise ValueError("batch_size must be positive and duration_s non-negative")
        self._steps.append((batch_size, duration_s))

    def statistics(self) -> SchedulerStatistics:
        """Snapshot of the pool and of step times over the whole window."""
        durations = sorted(d for _, d in self._steps)
        return SchedulerStatistics(
            max_slots=self._max_slots,
            live=self._live,
            releasing=self._releasing,
            free=len(self._free),
            capacity=self.capacity(),
            budget_s=self._budget_s,
            window_steps=len(durations),
            last_step_s=self._steps[-1][1] if self._steps else None,
            p50_step_s=_nearest_rank(durations, 0.5) if durations else None,
            p99_step_s=_nearest_rank(durations, 0.99) if durations else None,
            max_step_s=durations[-1] if durations else None,
        )

    def _expect(self, slot: int, state: SlotState) -> None:
        if not 0 <= slot < self._max_slots:
            raise ValueError(f"slot {slot} is outside the pool of {self._max_slots}")
        if self._states[slot] is not state:
            raise ValueError(f"slot {slot} is {self._states[slot].name}, not {state.name}")
