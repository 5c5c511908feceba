from __future__ import annotations

import pytest
import trio
import trio.testing

from duplex.actors import LaneSpec, Mailbox, Overflow
from duplex.exceptions import ActorStopped, MailboxFull


def lanes(data: Overflow = Overflow.BLOCK, capacity: int = 3) -> list[LaneSpec]:
    key = (lambda m: m[0]) if data is Overflow.COALESCE else None
    return [
        LaneSpec("control", capacity=2, priority=0),
        LaneSpec("data", capacity=capacity, overflow=data, priority=10, key=key),
    ]


async def test_control_overtakes_queued_data() -> None:
    box: Mailbox[str] = Mailbox(lanes())
    for m in ("d1", "d2", "d3"):
        await box.put("data", m)
    await box.put("control", "c1")
    assert [await box.get() for _ in range(4)] == ["c1", "d1", "d2", "d3"]


async def test_drop_oldest_counts_and_reports() -> None:
    dropped: list[tuple[str, str, object]] = []
    box: Mailbox[int] = Mailbox(
        lanes(Overflow.DROP_OLDEST, 2), on_drop=lambda *a: dropped.append(a)
    )
    for i in range(5):
        box.put_nowait("data", i)
    assert [box.get_nowait(), box.get_nowait()] == [3, 4]
    assert dropped == [("data", "overflow", 0), ("data", "overflow", 1), ("data", "overflow", 2)]
    assert box.statistics().lane("data").dropped == 3


async def test_coalesce_keeps_latest_per_key_in_send_order() -> None:
    box: Mailbox[tuple[str, int]] = Mailbox(lanes(Overflow.COALESCE, 3))
    for item in [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2)]:
        box.put_nowait("data", item)
    got = [box.get_nowait() for _ in range(3)]
    assert got == [("a", 2), ("c", 1), ("b", 2)]
    stats = box.statistics().lane("data")
    assert stats.coalesced == 2 and stats.dropped == 2


async def test_coalesce_full_without_match_drops_oldest() -> None:
    box: Mailbox[tuple[str, int]] = Mailbox(lanes(Overflow.COALESCE, 2))
    for item in [("a", 1), ("b", 1), ("c", 1)]:
        box.put_nowait("data", item)
    assert [box.get_nowait(), box.get_nowait()] == [("b", 1), ("c", 1)]


async def test_reject_raises_and_counts() -> None:
    box: Mailbox[int] = Mailbox(lanes(Overflow.REJECT, 1))
    box.put_nowait("data", 1)
    with pytest.raises(MailboxFull):
        box.put_nowait("data", 2)
    with pytest.raises(MailboxFull):
        await box.put("data", 3)
    assert box.statistics().lane("data").rejected == 2
    assert box.get_nowait() == 1


async def test_block_backpressure_admits_waiters_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    box: Mailbox[str] = Mailbox(lanes(Overflow.BLOCK, 1))
    await box.put("data", "first")
    finished: list[str] = []

    async def sender(name: str) -> None:
        await box.put("data", name)
        finished.append(name)

    async with trio.open_nursery() as nursery:
        for name in ("s1", "s2", "s3"):
            nursery.start_soon(sender, name)
            await trio.sleep(0.01)
        assert box.statistics().lane("data").senders_waiting == 3
        with pytest.raises(trio.WouldBlock):
            box.put_nowait("data", "late")  # may not jump the queue of waiters
        got = [await box.get() for _ in range(4)]
    assert got == ["first", "s1", "s2", "s3"]
    assert finished == ["s1", "s2", "s3"]


async def test_cancelled_blocked_put_is_not_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    box: Mailbox[str] = Mailbox(lanes(Overflow.BLOCK, 1))
    await box.put("data", "kept")
    with trio.move_on_after(1):
        await box.put("data", "cancelled")
    assert box.get_nowait() == "kept"
    with pytest.raises(trio.WouldBlock):
        box.get_nowait()
    assert box.statistics().lane("data").senders_waiting == 0


async def test_receiver_wakes_on_put(autojump_clock: trio.testing.MockClock) -> None:
    box: Mailbox[str] = Mailbox(lanes())
    async with trio.open_nursery() as nursery:

        async def later() -> None:
            await trio.sleep(2)
            await box.put("data", "x")

        nursery.start_soon(later)
        assert await box.get() == "x"
        assert trio.current_time() == pytest.approx(2)


async def test_close_returns_leftovers_and_fails_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    box: Mailbox[str] = Mailbox(lanes(Overflow.BLOCK, 1))
    await box.put("data", "d")
    await box.put("control", "c")
    errors: list[BaseException] = []

    async def blocked() -> None:
        try:
            await box.put("data", "waiting")
        except ActorStopped as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked)
        await trio.sleep(1)
        assert box.close() == ["c", "d"]
    assert len(errors) == 1
    with pytest.raises(trio.EndOfChannel):
        await box.get()
    with pytest.raises(ActorStopped):
        box.put_nowait("data", "after")
    assert box.close() == []


async def test_statistics_peak_and_unknown_lane() -> None:
    box: Mailbox[int] = Mailbox(lanes(Overflow.BLOCK, 3))
    for i in range(3):
        box.put_nowait("data", i)
    box.get_nowait()
    stats = box.statistics().lane("data")
    assert (stats.queued, stats.peak, stats.delivered) == (2, 3, 1)
    with pytest.raises(ValueError, match="no lane"):
        box.put_nowait("video", 1)


def test_lane_spec_validation() -> None:
    with pytest.raises(ValueError, match="capacity"):
        LaneSpec("x", capacity=0)
    with pytest.raises(ValueError, match="key"):
        LaneSpec("x", capacity=1, overflow=Overflow.COALESCE)
    with pytest.raises(ValueError, match="duplicate"):
        Mailbox([LaneSpec("x", capacity=1), LaneSpec("x", capacity=1)])


async def test_interrupt_wakes_a_parked_receiver(autojump_clock: trio.testing.MockClock) -> None:
    from duplex.actors._mailbox import Interrupted

    box: Mailbox[str] = Mailbox(lanes())
    async with trio.open_nursery() as nursery:

        async def later() -> None:
            await trio.sleep(1)
            box.interrupt()

        nursery.start_soon(later)
        with pytest.raises(Interrupted):
            await box.get()
    box.interrupt()  # no receiver: nothing happens
    await box.put("data", "x")
    assert await box.get() == "x"
