"""A bounded mailbox with priority lanes and a per-lane overflow policy.

Lanes are deques rather than ``trio`` memory channels because two of the
policies (drop-oldest, coalesce) must reach into what is already queued. The
waiting discipline is the one ``trio._channel`` uses: parked senders and the
parked receiver are rescheduled explicitly, and cancellation is resolved
atomically by an abort function, so a message is either delivered exactly once
or its ``put`` raised.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, final

import outcome
import trio

from duplex.exceptions import ActorStopped, MailboxFull

T = TypeVar("T")


class Overflow(enum.Enum):
    """What a full lane does with one more message."""

    BLOCK = "block"
    """The sender waits (backpressure); senders are admitted in arrival order."""
    DROP_OLDEST = "drop_oldest"
    """The oldest queued message is dropped (counted) to make room."""
    COALESCE = "coalesce"
    """A queued message with the same key is replaced (counted); else drop-oldest."""
    REJECT = "reject"
    """The sender gets ``MailboxFull``."""


@final
@dataclass(frozen=True, slots=True)
class LaneSpec:
    """One lane: lower ``priority`` values are served first."""

    name: str
    capacity: int
    overflow: Overflow = Overflow.BLOCK
    priority: int = 10
    key: Callable[[object], Hashable] | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"lane {self.name!r}: capacity must be >= 1, got {self.capacity}")
        if self.overflow is Overflow.COALESCE and self.key is None:
            raise ValueError(f"lane {self.name!r}: coalesce needs a key function")


CONTROL = LaneSpec("control", capacity=256, overflow=Overflow.BLOCK, priority=0)
DATA = LaneSpec("data", capacity=1024, overflow=Overflow.BLOCK, priority=10)
DEFAULT_LANES: tuple[LaneSpec, ...] = (CONTROL, DATA)


@final
@dataclass(frozen=True, slots=True)
class LaneStatistics:
    name: str
    queued: int
    capacity: int
    peak: int
    delivered: int
    dropped: int
    coalesced: int
    rejected: int
    senders_waiting: int


@final
@dataclass(frozen=True, slots=True)
class MailboxStatistics:
    lanes: tuple[LaneStatistics, ...]
    closed: bool

    def lane(self, name: str) -> LaneStatistics:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)


class Interrupted(Exception):
    """``Mailbox.get`` was woken by ``interrupt()`` without a message."""


DropHook = Callable[[str, str, object], None]
"""Called as ``hook(lane, reason, message)`` for every message a lane drops."""


class _Lane(Generic[T]):
    __slots__ = (
        "coalesced",
        "delivered",
        "dropped",
        "peak",
        "queue",
        "rejected",
        "spec",
        "waiters",
    )

    def __init__(self, spec: LaneSpec):
        self.spec = spec
        self.queue: deque[T] = deque()
        self.waiters: OrderedDict[trio.lowlevel.Task, T] = OrderedDict()
        self.peak = 0
        self.delivered = 0
        self.dropped = 0
        self.coalesced = 0
        self.rejected = 0

    def statistics(self) -> LaneStatistics:
        return LaneStatistics(
            name=self.spec.name,
            queued=len(self.queue),
            capacity=self.spec.capacity,
            peak=self.peak,
            delivered=self.delivered,
            dropped=self.dropped,
            coalesced=self.coalesced,
            rejected=self.rejected,
            senders_waiting=len(self.waiters),
        )


@final
class Mailbox(Generic[T]):
    """Bounded, multi-lane, single-receiver queue.

    ``put``/``put_nowait`` take the lane name; ``get`` returns the oldest message
    of the highest-priority non-empty lane, so control never waits behind data.
    Within a lane delivery is FIFO, hence FIFO per sender.
    """

    def __init__(
        self, lanes: Sequence[LaneSpec] = DEFAULT_LANES, *, on_drop: DropHook | None = None
    ):
        if not lanes:
            raise ValueError("a mailbox needs at least one lane")
        names = [lane.name for lane in lanes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate lane names: {names}")
        ordered = sorted(lanes, key=lambda s: s.priority)
        self._lanes: dict[str, _Lane[T]] = {s.name: _Lane(s) for s in ordered}
        self._by_priority: tuple[_Lane[T], ...] = tuple(self._lanes.values())
        self._receiver: trio.lowlevel.Task | None = None
        self._closed = False
        self._closed_event = trio.Event()
        self._on_drop = on_drop

    @property
    def closed(self) -> bool:
        return self._closed

    def lane_names(self) -> tuple[str, ...]:
        return tuple(self._lanes)

    def _lane(self, name: str) -> _Lane[T]:
        try:
            return self._lanes[name]
        except KeyError:
            raise ValueError(f"no lane {name!r}; lanes are {list(self._lanes)}") from None

    def _drop(self, lane: _Lane[T], reason: str, item: T) -> None:
        lane.dropped += 1
        if self._on_drop is not None:
            self._on_drop(lane.spec.name, reason, item)

    def _enqueue(self, lane: _Lane[T], item: T) -> None:
        lane.queue.append(item)
        if len(lane.queue) > lane.peak:
            lane.peak = len(lane.queue)
        if self._receiver is not None:
            task, self._receiver = self._receiver, None
            trio.lowlevel.reschedule(task)

    def put_nowait(self, lane_name: str, item: T) -> None:
        """Queue ``item`` or apply the lane's overflow policy.

        Raises:
            ActorStopped: the mailbox is closed.
            MailboxFull: a ``reject`` lane is full.
            trio.WouldBlock: a ``block`` lane is full (or has senders waiting).
        """
        lane = self._lane(lane_name)
        if self._closed:
            raise ActorStopped("mailbox is closed")
        spec = lane.spec
        if spec.overflow is Overflow.COALESCE:
            assert spec.key is not None
            k = spec.key(item)
            for i, queued in enumerate(lane.queue):
                if spec.key(queued) == k:
                    del lane.queue[i]
                    lane.coalesced += 1
                    self._drop(lane, "coalesced", queued)
                    break
        if len(lane.queue) < spec.capacity and not lane.waiters:
            self._enqueue(lane, item)
            return
        if spec.overflow is Overflow.BLOCK:
            raise trio.WouldBlock
        if spec.overflow is Overflow.REJECT:
            lane.rejected += 1
            raise MailboxFull(f"lane {spec.name!r} is full ({spec.capacity})")
        self._drop(lane, "overflow", lane.queue.popleft())
        self._enqueue(lane, item)

    async def put(self, lane_name: str, item: T) -> None:
        """Queue ``item``; on a full ``block`` lane, wait for room (in arrival order)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.put_nowait(lane_name, item)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        lane = self._lanes[lane_name]
        task = trio.lowlevel.current_task()
        lane.waiters[task] = item

        def abort(_: object) -> trio.lowlevel.Abort:
            del lane.waiters[task]
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _admit_waiter(self, lane: _Lane[T]) -> None:
        if lane.waiters and len(lane.queue) < lane.spec.capacity:
            task, item = lane.waiters.popitem(last=False)
            self._enqueue(lane, item)
            trio.lowlevel.reschedule(task)

    def get_nowait(self) -> T:
        """The next message by lane priority.

        Raises:
            trio.WouldBlock: nothing is queued.
            trio.EndOfChannel: the mailbox is closed and empty.
        """
        for lane in self._by_priority:
            if lane.queue:
                item = lane.queue.popleft()
                lane.delivered += 1
                self._admit_waiter(lane)
                return item
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def get(self) -> T:
        """Wait for the next message (one receiver at a time).

        Raises:
            trio.EndOfChannel: the mailbox is closed and empty.
            Interrupted: ``interrupt()`` woke the receiver before a message came.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        parked = False
        while True:
            try:
                item = self.get_nowait()
            except trio.WouldBlock:
                pass
            else:
                if not parked:  # parking was the schedule point: no second one per message
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return item
            if self._receiver is not None:
                raise trio.BusyResourceError("a mailbox has exactly one receiver")
            self._receiver = trio.lowlevel.current_task()

            def abort(_: object) -> trio.lowlevel.Abort:
                self._receiver = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
            parked = True

    async def wait_closed(self) -> None:
        """Wait until ``close`` was called."""
        await self._closed_event.wait()

    def interrupt(self) -> None:
        """Wake a receiver parked in ``get`` so it can notice a stop request."""
        if self._receiver is not None:
            task, self._receiver = self._receiver, None
            trio.lowlevel.reschedule(task, outcome.Error(Interrupted()))

    def close(self) -> list[T]:
        """Refuse new messages; parked senders get ``ActorStopped``.

        Returns what was still queued, in lane priority order, so the owner can
        route it to dead letters; parked senders know their message was refused.
        """
        if self._closed:
            return []
        self._closed = True
        self._closed_event.set()
        leftover: list[T] = []
        for lane in self._by_priority:
            leftover.extend(lane.queue)
            lane.queue.clear()
            for task in list(lane.waiters):
                lane.waiters.pop(task)
                trio.lowlevel.reschedule(
                    task, outcome.Error(ActorStopped("mailbox closed while waiting"))
                )
        if self._receiver is not None:
            task, self._receiver = self._receiver, None
            trio.lowlevel.reschedule(task)
        return leftover

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(
            lanes=tuple(lane.statistics() for lane in self._by_priority), closed=self._closed
        )
