"""The wait queue of a full server (`WaitQueue`): its bound, its order, its leavers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from duplex.transport._wait_queue import WaitQueue, WaitQueueFull


class Room:
    """Slots a test frees by hand; ``take`` takes one if there is one."""

    def __init__(self) -> None:
        self.free = 0
        self.taken: list[str] = []
        self.lose_next = 0
        """Takes that lose their race (another endpoint took the slot first)."""

    def has(self) -> bool:
        return self.free > 0

    def taker(self, name: str) -> Callable[[], Awaitable[bool]]:
        async def take() -> bool:
            await trio.lowlevel.checkpoint()
            if self.lose_next:
                self.lose_next -= 1
                return False
            self.free -= 1
            self.taken.append(name)
            return True

        return take


async def test_the_queue_holds_its_size_and_refuses_one_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = WaitQueue(2), Room()
    async with trio.open_nursery() as nursery:
        for name in ("a", "b"):
            nursery.start_soon(queue.wait, room.has, room.taker(name))
            await trio.sleep(0.01)  # they arrive in this order
        await trio.sleep(10)  # full server: both wait, for as long as it takes
        assert queue.waiting == 2 and room.taken == []
        with pytest.raises(WaitQueueFull):
            await queue.wait(room.has, room.taker("c"))
        room.free = 2  # slots free: both get one, and the queue takes newcomers again
    assert room.taken == ["a", "b"]
    stats = queue.statistics()
    assert (stats.waiting, stats.peak_waiting, stats.admitted, stats.refused) == (0, 2, 2, 1)
    await queue.wait(lambda: True, room.taker("c"))  # recovers: room at once, no wait
    assert room.taken[-1] == "c"


async def test_first_come_first_served_even_when_the_head_loses_a_race(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = WaitQueue(8), Room()
    async with trio.open_nursery() as nursery:
        for name in "abcd":
            nursery.start_soon(queue.wait, room.has, room.taker(name))
            await trio.sleep(0.01)  # they arrive in this order
        room.free, room.lose_next = 1, 3  # the head loses three times, then wins
        await trio.sleep(1)
        assert room.taken == ["a"]
        for _ in range(3):
            room.free = 1
            await trio.sleep(1)
    assert room.taken == list("abcd")


async def test_a_waiter_that_goes_leaves_its_place_to_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = WaitQueue(2), Room()
    async with trio.open_nursery() as nursery:
        leaver = trio.CancelScope()

        async def leaves() -> None:
            with leaver:
                await queue.wait(room.has, room.taker("a"))

        nursery.start_soon(leaves)
        await trio.sleep(0.01)
        nursery.start_soon(queue.wait, room.has, room.taker("b"))
        await trio.sleep(1)
        leaver.cancel()  # the peer left
        await trio.sleep(1)
        assert queue.waiting == 1
        room.free = 1
    assert room.taken == ["b"]
    assert (queue.statistics().left, queue.statistics().admitted) == (1, 1)


def test_a_queue_holds_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least one"):
        WaitQueue(0)
