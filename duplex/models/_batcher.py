"""`RequestBatcher`: which queued requests run next, decided on numbers.

Requests wait in one FIFO of tickets (plain ints; the driver keeps what they
carry). The one rule, applied in `due`:

    a batch is due when ``max_batch`` requests wait, or when the oldest has
    waited ``max_wait_s``; then the oldest ``max_batch`` run together.

The engine takes a batch only when its runner is free. So a lone request waits
at most ``max_wait_s`` for company, and while a batch runs the next one
gathers: its oldest request has usually waited ``max_wait_s`` by the time the
runner is free, and it runs at once with everything that arrived meanwhile.
The queue is bounded (``max_queue``): a full queue refuses, and counts it.

Requests come in two priority classes (`Priority`): a live session's work
(``REALTIME``: the voice agent's sentences and its speech recognition) and
everything else (``BATCH``: HTTP speech, images, robots). Each class has its own
FIFO and its own bound, so batch work never fills the queue against a live
session; a batch holds one class only, and the runner takes the realtime FIFO
first whenever it has anything, due or not (it would only wait for company).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import final

from duplex.exceptions import ConfigError

__all__ = ["BatcherStatistics", "Priority", "RequestBatcher"]


class Priority(IntEnum):
    """A request's class: lower runs first."""

    REALTIME = 0
    """A live session's work: first in the queue, and run without waiting for slack."""
    BATCH = 1
    """Everything else: after the realtime work, in the slack between realtime ticks."""


@final
@dataclass(frozen=True, slots=True)
class BatcherStatistics:
    """Counters since the batcher was made.

    Args:
        queued: requests waiting now.
        peak_queued: the most that ever waited at once.
        submitted: requests accepted.
        refused: requests refused because the queue was full.
        cancelled: requests withdrawn before they ran (their client left).
        batches: batches taken.
        batched: requests taken in batches.
        largest_batch: the largest batch taken.
    """

    queued: int
    peak_queued: int
    submitted: int
    refused: int
    cancelled: int
    batches: int
    batched: int
    largest_batch: int


@final
class RequestBatcher:
    """A bounded FIFO of request tickets per `Priority` and the rule that cuts them into
    batches.

    Args:
        max_batch: the most requests one batch holds (>= 1).
        max_wait_s: the longest the oldest request waits for others (>= 0).
        max_queue: the most requests of one class waiting at once (>= ``max_batch``).

    Raises:
        ConfigError: a bound out of range.
    """

    def __init__(self, *, max_batch: int, max_wait_s: float, max_queue: int) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch: must be >= 1, got {max_batch}")
        if not max_wait_s >= 0:
            raise ConfigError(f"max_wait_s: must be >= 0, got {max_wait_s}")
        if max_queue < max_batch:
            raise ConfigError(f"max_queue: must be >= max_batch ({max_batch}), got {max_queue}")
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self._queues: dict[Priority, OrderedDict[int, float]] = {p: OrderedDict() for p in Priority}
        """class -> ticket -> the time it was submitted, oldest first."""
        self._peak = 0
        self._submitted = 0
        self._refused = 0
        self._cancelled = 0
        self._batches = 0
        self._batched = 0
        self._largest = 0

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def submit(self, ticket: int, now: float, priority: Priority = Priority.BATCH) -> bool:
        """Queue ``ticket`` (unique among the queued) in its class; ``False``: that class's
        queue is full."""
        queue = self._queues[priority]
        if len(queue) >= self.max_queue:
            self._refused += 1
            return False
        queue[ticket] = now
        self._submitted += 1
        self._peak = max(self._peak, len(self))
        return True

    def cancel(self, ticket: int) -> bool:
        """Withdraw a queued ticket; ``False``: it is not queued (taken, or never was)."""
        for queue in self._queues.values():
            if queue.pop(ticket, None) is not None:
                self._cancelled += 1
                return True
        return False

    def due(self) -> float | None:
        """When the next batch is due (it may be in the past); ``None``: nothing waits."""
        dues = [self._due(queue) for queue in self._queues.values() if queue]
        return min(dues) if dues else None

    def _due(self, queue: OrderedDict[int, float]) -> float:
        oldest = next(iter(queue.values()))
        if len(queue) >= self.max_batch:
            return oldest
        return oldest + self.max_wait_s

    def next_class(self) -> Priority | None:
        """The class `take` takes from now: the first that has anything (``None``: none)."""
        return next((p for p, queue in self._queues.items() if queue), None)

    def take(self) -> list[int]:
        """The oldest ``max_batch`` tickets of `next_class`, removed from its queue (may be
        empty)."""
        priority = self.next_class()
        if priority is None:
            return []
        queue = self._queues[priority]
        count = min(self.max_batch, len(queue))
        batch = [queue.popitem(last=False)[0] for _ in range(count)]
        if batch:
            self._batches += 1
            self._batched += len(batch)
            self._largest = max(self._largest, len(batch))
        return batch

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(
            queued=len(self),
            peak_queued=self._peak,
            submitted=self._submitted,
            refused=self._refused,
            cancelled=self._cancelled,
            batches=self._batches,
            batched=self._batched,
            largest_batch=self._largest,
        )
