"""Priority classes inside one request engine, under MockClock: a live session's requests
(``Priority.REALTIME``) go first and run ungated, HTTP work (``Priority.BATCH``) runs in the
slack; the batcher's rule as a property; each class bounded on its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from duplex.exceptions import RequestsOverloaded
from duplex.models import EngineDriver, Priority, RequestBatcher, RequestEngine, Slack, UnitGate

from .models_support import SPEC, loopback_engine, tone

PERIOD = SPEC.frame_period_s
T = TypeVar("T")
RT, BATCH = Priority.REALTIME, Priority.BATCH


# -- the batcher's rule ----------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(list(Priority))),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
        st.tuples(st.just("take"), st.none()),
    ),
    max_size=60,
)


@given(ops, st.integers(1, 4))
def test_a_batch_holds_one_class_realtime_first_each_in_order(
    steps: list[tuple[str, Any]], max_batch: int
) -> None:
    batcher = RequestBatcher(max_batch=max_batch, max_wait_s=0.01, max_queue=max_batch + 2)
    queued: dict[Priority, list[int]] = {p: [] for p in Priority}  # the model: two FIFOs
    refused = 0
    for ticket, (op, arg) in enumerate(steps):
        if op == "submit":
            full = len(queued[arg]) >= batcher.max_queue
            assert batcher.submit(ticket, float(ticket), arg) is not full
            refused += full
            if not full:
                queued[arg].append(ticket)
        elif op == "cancel":
            mine = [p for p in Priority if arg in queued[p]]
            assert batcher.cancel(arg) is bool(mine)
            for p in mine:
                queued[p].remove(arg)
        else:
            first = next((p for p in Priority if queued[p]), None)
            assert batcher.next_class() is first
            expected = [] if first is None else queued[first][:max_batch]
            assert batcher.take() == expected
            if first is not None:
                del queued[first][:max_batch]
        assert len(batcher) == sum(map(len, queued.values()))
    assert batcher.statistics().refused == refused


def test_each_class_has_its_own_bound() -> None:
    batcher = RequestBatcher(max_batch=1, max_wait_s=0.0, max_queue=1)
    assert batcher.submit(0, 0.0, BATCH)
    assert not batcher.submit(1, 0.0, BATCH)  # batch work is full
    assert batcher.submit(2, 0.0, RT)  # a live session's work still goes in, and first
    assert batcher.take() == [2] and batcher.take() == [0]


# -- the engine ------------------------------------------------------------------------------


class Recorded:
    """A single-unit runner that records what ran and when (mock time)."""

    name = "recorded"

    def __init__(self, max_batch: int = 1) -> None:
        self.max_batch = max_batch
        self.ran: list[tuple[float, list[int]]] = []

    def run_batch(self, requests: Sequence[int], gate: UnitGate) -> list[int]:
        self.ran.append((trio.current_time(), list(requests)))
        return [r * 10 for r in requests]


def timed(seconds: float) -> Callable[..., Any]:
    """An offload that takes ``seconds`` of mock time."""

    async def offload(fn: Callable[[], T]) -> T:
        await trio.sleep(seconds)
        return fn()

    return offload


async def test_realtime_requests_run_while_a_step_runs_and_batch_ones_wait_for_the_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No window (a step runs): the batch request waits, the realtime one submitted after it
    runs at once, ungated; the batch one runs when the window opens."""
    slack = Slack()
    runner = Recorded()
    engine = RequestEngine(
        runner, max_wait_s=0.0, slack=slack, offload=timed(0.005), timer=trio.current_time
    )
    answers: dict[int, float] = {}

    async def client(request: int, priority: Priority) -> None:
        assert await engine.submit(request, priority=priority) == request * 10
        answers[request] = trio.current_time()

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        slack.step_started()
        nursery.start_soon(client, 1, BATCH)
        await trio.sleep(0.010)
        assert runner.ran == []  # no window
        began = trio.current_time()
        nursery.start_soon(client, 2, RT)
        await trio.sleep(0.010)
        assert [requests for _, requests in runner.ran] == [[2]]  # it did not wait
        assert answers[2] == pytest.approx(began + 0.005)
        slack.step_ended(trio.current_time() + 1.0)
        await trio.sleep(0.010)
        assert [requests for _, requests in runner.ran] == [[2], [1]]
        nursery.cancel_scope.cancel()
    assert slack.statistics().units == 1  # the batch request's; the realtime one took none


async def test_queued_realtime_work_goes_before_older_batch_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Four batch requests wait behind a running batch; two realtime requests that come
    later run next, together, and then the batch ones in their order."""
    runner = Recorded(max_batch=2)
    engine = RequestEngine(
        runner, max_wait_s=0.0, slack=Slack(), offload=timed(0.050), timer=trio.current_time
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        for request in range(1, 6):
            nursery.start_soon(engine.submit, request)
            await trio.sleep(0)
        await trio.sleep(0.010)  # [1, 2] runs; 3, 4, 5 wait
        for request in (-1, -2):
            nursery.start_soon(partial_submit(engine, request, RT))
            await trio.sleep(0)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert [requests for _, requests in runner.ran] == [[1, 2], [-1, -2], [3, 4], [5]]


def partial_submit(engine: RequestEngine[int, int], request: int, priority: Priority) -> Any:
    async def submit() -> None:
        await engine.submit(request, priority=priority)

    return submit


async def test_beside_ticks_realtime_units_run_at_once_and_batch_units_only_in_windows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 30 ms step every 80 ms, and 60 ms units (no 50 ms window fits one): batch requests
    wait (the first two units run, warm-up and measure; then none), while realtime requests
    to the same runner each run when they come (ungated: they may overlap a step), and a
    full batch-class queue does not refuse them."""
    slack = Slack()
    driver = EngineDriver(loopback_engine(), offload=timed(0.030), slack=slack)
    send, _recv = trio.open_memory_channel[Any](100000)
    handle = driver.attach("a", send)
    assert handle is not None
    runner = Recorded()
    engine = RequestEngine(
        runner,
        max_wait_s=0.0,
        max_queue=2,
        slack=slack,
        offload=timed(0.060),
        timer=trio.current_time,
    )
    waits: list[float] = []

    async def realtime(request: int) -> None:
        began = trio.current_time()
        await engine.submit(request, priority=RT)
        waits.append(trio.current_time() - began)

    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await nursery.start(engine.run)
        for k in range(3):
            driver.push_input(handle, tone(1, k))
        nursery.start_soon(engine.submit, 1)
        await trio.sleep(0.040)  # it runs in the first window
        for request in (2, 3):  # 1 and 2 run (warm-up, measure); 3 waits
            nursery.start_soon(engine.submit, request)
            await trio.sleep(0)
        await trio.sleep(1.0)
        assert sorted(r for _, batch in runner.ran for r in batch) == [1, 2]
        nursery.start_soon(engine.submit, 4)
        while engine.statistics().batcher.queued < 2:  # trio may run either task first
            await trio.sleep(0)
        with pytest.raises(RequestsOverloaded):
            await engine.submit(5)  # the batch class is full
        for request in range(-1, -6, -1):
            nursery.start_soon(realtime, request)
            await trio.sleep(0.5)
        assert len(waits) == 5 and max(waits) == pytest.approx(0.060)
        assert sorted(r for _, batch in runner.ran for r in batch) == [-5, -4, -3, -2, -1, 1, 2]
        driver.detach(handle)  # realtime sessions gone: the window opens for the rest
        await trio.sleep(0.5)
        assert sorted(r for _, batch in runner.ran for r in batch)[-2:] == [3, 4]
        nursery.cancel_scope.cancel()
