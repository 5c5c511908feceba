"""The connection cap as pure bookkeeping: who is held, who waits longest, who is evicted."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from duplex.transport._connection_cap import (
    CONNECTION_BYTES,
    MIN_RESERVE,
    ConnectionCap,
    Held,
    auto_connection_limit,
)

GIB = 1 << 30


def test_idle_goes_before_uploading_and_working_stays() -> None:
    cap = ConnectionCap(limit=3, overflow=1)
    working, uploading, idle = (cap.accept().held for _ in range(3))
    assert working and uploading and idle
    cap.begin(working, body=False)  # a WebSocket
    cap.begin(uploading, body=True)  # a body still arriving
    first = cap.accept()
    assert first.evicted is idle and first.evicted_as == "idle" and first.held is not None
    cap.begin(first.held, body=False)
    second = cap.accept()
    assert second.evicted is uploading and second.evicted_as == "uploading"
    cap.begin(second.held, body=False)  # type: ignore[arg-type]
    assert cap.overflowing == 2  # evicted, until their sockets close
    cap.release(idle)
    cap.release(uploading)
    third = cap.accept()  # every held one works: overflow, then nothing
    assert third.held is not None and third.held.overflow and third.evicted is None
    assert cap.accept().held is None
    cap.release(third.held)
    assert cap.accept().held is not None  # the overflow's room is back


def test_a_finished_body_stops_waiting_and_an_ended_request_waits_again() -> None:
    cap = ConnectionCap(limit=1, overflow=0)
    held = cap.accept().held
    assert held is not None
    cap.begin(held, body=True)
    assert cap.waiting() == (0, 1)
    cap.body_done(held)
    assert cap.waiting() == (0, 0)
    assert cap.accept().held is None  # working, no overflow
    cap.end(held, body_done=True)
    assert cap.waiting() == (1, 0)
    assert cap.accept().evicted is held


def test_the_limit_follows_descriptors_and_memory() -> None:
    # the common default of 1,024 descriptors, 40 open: 1024 - 40 - 64 reserved
    assert auto_connection_limit(1024, 40, 24 * GIB) == (1024 - 40 - MIN_RESERVE, MIN_RESERVE // 2)
    # a raised limit: a reserve of 1/16, and memory caps it (an eighth at 64 KiB each)
    limit, overflow = auto_connection_limit(1 << 20, 100, 24 * GIB)
    assert limit == 24 * GIB // 8 // CONNECTION_BYTES and overflow == (1 << 20) // 32
    assert auto_connection_limit(64, 60, GIB) == (1, MIN_RESERVE // 2)  # never below one
    with pytest.raises(ValueError):
        ConnectionCap(0, 1)


class CapMachine(RuleBasedStateMachine):
    """Against a plain model: the limit is never passed, and the one evicted is always
    the longest-waiting idle connection, else the longest-waiting uploading one."""

    def __init__(self) -> None:
        super().__init__()
        self.limit, self.overflow = 4, 2
        self.cap = ConnectionCap(self.limit, self.overflow)
        self.clock = 0
        self.conns: list[Held] = []
        self.since: dict[int, tuple[str, int]] = {}  # id -> (waiting kind, since)
        self.bodies: dict[int, list[bool]] = {}  # id -> each request's body arrived?

    def _kind(self, held: Held) -> str:
        if held.requests == 0:
            return "idle"
        return "uploading" if held.uploading == held.requests else "working"

    def _touch(self, held: Held) -> None:
        self.clock += 1
        kind = self._kind(held)
        if self.since.get(id(held), ("", 0))[0] != kind:
            self.since[id(held)] = (kind, self.clock)

    @rule()
    def accept(self) -> None:
        normal = [c for c in self.conns if not c.overflow]
        waiting = [c for c in normal if self._kind(c) != "working"]
        overflowing = sum(c.overflow for c in self.conns)
        admitted = self.cap.accept()
        if len(normal) < self.limit:
            assert admitted.held is not None and admitted.evicted is None
        elif waiting:
            rank = {"idle": 0, "uploading": 1}
            expect = min(waiting, key=lambda c: (rank[self._kind(c)], self.since[id(c)][1]))
            assert admitted.evicted is expect and admitted.evicted_as == self._kind(expect)
        elif overflowing < self.overflow:
            assert admitted.held is not None and admitted.held.overflow
        else:
            assert admitted.held is None
        if admitted.held is not None:
            self.conns.append(admitted.held)
            self.bodies[id(admitted.held)] = []
            self._touch(admitted.held)

    @precondition(lambda self: self.conns)
    @rule(pick=st.integers(0, 99), body=st.booleans())
    def begin(self, pick: int, body: bool) -> None:
        held = self.conns[pick % len(self.conns)]
        self.cap.begin(held, body=body)
        self.bodies[id(held)].append(not body)
        self._touch(held)

    @precondition(lambda self: any(False in b for b in self.bodies.values()))
    @rule(pick=st.integers(0, 99))
    def body_done(self, pick: int) -> None:
        pending = [c for c in self.conns if False in self.bodies[id(c)]]
        held = pending[pick % len(pending)]
        bodies = self.bodies[id(held)]
        bodies[bodies.index(False)] = True
        self.cap.body_done(held)
        self._touch(held)

    @precondition(lambda self: any(self.bodies.values()))
    @rule(pick=st.integers(0, 99))
    def end(self, pick: int) -> None:
        busy = [c for c in self.conns if self.bodies[id(c)]]
        held = busy[pick % len(busy)]
        arrived = self.bodies[id(held)].pop()
        self.cap.end(held, body_done=arrived)
        self._touch(held)

    @precondition(lambda self: self.conns)
    @rule(pick=st.integers(0, 99))
    def release(self, pick: int) -> None:
        held = self.conns.pop(pick % len(self.conns))
        self.cap.release(held)
        del self.bodies[id(held)], self.since[id(held)]

    @invariant()
    def counts_agree(self) -> None:
        normal = [c for c in self.conns if not c.overflow]
        assert self.cap.held == len(normal) <= self.limit
        assert self.cap.overflowing == len(self.conns) - len(normal)
        kinds = [self._kind(c) for c in normal]
        assert self.cap.waiting() == (kinds.count("idle"), kinds.count("uploading"))


CapMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_cap_machine = CapMachine.TestCase
