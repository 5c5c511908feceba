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
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import final

from duplex.exceptions import ConfigError

__all__ = ["BatcherStatistics", "RequestBatcher"]


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
    """A bounded FIFO of request tickets and the rule that cuts it into batches.

    Args:
        max_batch: the most requests one batch holds (>= 1).
        max_wait_s: the longest the oldest request waits for others (>= 0).
        max_queue: the most requests waiting at once (>= ``max_batch``).

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
        self._queue: OrderedDict[int, float] = OrderedDict()
        """ticket -> the time it was submitted, oldest first."""
        self._peak = 0
        self._submitted = 0
        self._refused = 0
        self._cancelled = 0
        self._batches = 0
        self._batched = 0
        self._largest = 0

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, ticket: int, now: float) -> bool:
        """Queue ``ticket`` (unique among the queued); ``False``: the queue is full."""
        if len(self._queue) >= self.max_queue:
            self._refused += 1
            return False
        self._queue[ticket] = now
        self._submitted += 1
        self._peak = max(self._peak, len(self._queue))
        return True

    def cancel(self, ticket: int) -> bool:
        """Withdraw a queued ticket; ``False``: it is not queued (taken, or never was)."""
        if self._queue.pop(ticket, None) is None:
            return False
        self._cancelled += 1
        return True

    def due(self) -> float | None:
        """When the next batch is due (it may be in the past); ``None``: nothing waits."""
        if not self._queue:
            return None
        oldest = next(iter(self._queue.values()))
        if len(self._queue) >= self.max_batch:
            return oldest
        return oldest + self.max_wait_s

    def take(self) -> list[int]:
        """The oldest ``max_batch`` tickets, removed from the queue (may be empty)."""
        count = min(self.max_batch, len(self._queue))
        batch = [self._queue.popitem(last=False)[0] for _ in range(count)]
        if batch:
            self._batches += 1
            self._batched += len(batch)
            self._largest = max(self._largest, len(batch))
        return batch

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(
            queued=len(self._queue),
            peak_queued=self._peak,
            submitted=self._submitted,
            refused=self._refused,
            cancelled=self._cancelled,
            batches=self._batches,
            batched=self._batched,
            largest_batch=self._largest,
        )
