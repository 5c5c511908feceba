"""Property tests: random interleavings of tells, asks and crashes lose nothing silently.

Every message is accounted for exactly once: handled by the actor, dropped by
its lane's policy (counted), refused to its sender (``MailboxFull``), or sent
to dead letters. Per-sender FIFO holds within a lane, control is never handled
while data waits ahead of it, and no task outlives the system.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.actors import (
    Actor,
    ActorContext,
    ControlMessage,
    LaneSpec,
    Overflow,
    SupervisorSpec,
    open_actor_system,
)
from duplex.exceptions import ActorStopped, AskTimeout, MailboxFull
from duplex.metrics import MetricsRegistry


@dataclass(frozen=True)
class Data:
    sender: int
    seq: int
    crash: bool = False
    work: float = 0.0


@dataclass(frozen=True)
class Ctl(ControlMessage):
    sender: int
    seq: int


class Probe(Actor[Any]):
    def __init__(self, handled: list[Any]):
        self.handled = handled

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        self.handled.append(message)
        if isinstance(message, Data):
            if message.work:
                await trio.sleep(message.work)
            if message.crash:
                raise RuntimeError("crash on purpose")
        return message.seq


op = st.tuples(
    st.sampled_from(["tell", "ask", "control", "crash"]),
    st.sampled_from([0.0, 0.0, 0.01, 0.05]),  # sender pause before the op
    st.sampled_from([0.0, 0.0, 0.02]),  # actor work time
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    senders=st.lists(st.lists(op, max_size=25), min_size=1, max_size=4),
    overflow=st.sampled_from(list(Overflow)),
    capacity=st.integers(1, 4),
)
def test_every_message_accounted_once(
    senders: list[list[tuple[str, float, float]]], overflow: Overflow, capacity: int
) -> None:
    trio.run(
        _scenario,
        senders,
        overflow,
        capacity,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )


async def _scenario(
    senders: list[list[tuple[str, float, float]]], overflow: Overflow, capacity: int
) -> None:
    registry = MetricsRegistry()
    handled: list[Any] = []
    overtaken: dict[int, list[Any]] = {}  # id(control) -> data queued when it was sent
    refused: list[Any] = []
    asked_ok: list[Any] = []
    asked_failed: list[Any] = []
    dropped: list[Any] = []
    key = (lambda env: env.message.seq % 2) if overflow is Overflow.COALESCE else None
    lanes = (
        LaneSpec("control", capacity=128, priority=0),
        LaneSpec("data", capacity=capacity, overflow=overflow, key=key),
    )
    baseline = trio.lowlevel.current_statistics().tasks_living
    sent: list[Any] = []
    spec = SupervisorSpec(max_restarts=10_000, period=1.0)
    async with open_actor_system(registry=registry, root=spec) as system:
        ref = await system.spawn(Probe, handled, name="probe", lanes=lanes)
        original_drop = ref._mailbox._on_drop

        def on_drop(lane: str, reason: str, envelope: Any) -> None:
            dropped.append(envelope.message)
            assert original_drop is not None
            original_drop(lane, reason, envelope)

        ref._mailbox._on_drop = on_drop

        async def run_sender(index: int, ops: list[tuple[str, float, float]]) -> None:
            for seq, (kind, pause, work) in enumerate(ops):
                if pause:
                    await trio.sleep(pause)
                msg: Any
                if kind == "control":
                    msg = Ctl(index, seq)
                else:
                    msg = Data(index, seq, crash=kind == "crash", work=work)
                sent.append(msg)
                try:
                    if kind == "control":  # the lane has room: enqueued without waiting
                        queued = ref._mailbox._lanes["data"].queue
                        overtaken[id(msg)] = [env.message for env in queued]
                    if kind == "ask":
                        await ref.ask(msg, timeout=30)
                        asked_ok.append(msg)
                    else:
                        await ref.tell(msg)
                except MailboxFull:
                    if kind == "ask" and msg in dropped:
                        asked_failed.append(msg)
                    else:
                        refused.append(msg)
                except (AskTimeout, ActorStopped):  # pragma: no cover - must not happen
                    raise

        async with trio.open_nursery() as nursery:
            for i, ops in enumerate(senders):
                nursery.start_soon(run_sender, i, ops)
        await trio.sleep(5)  # let the actor drain
    assert trio.lowlevel.current_statistics().tasks_living == baseline
    # control overtakes every data message that was queued when it was sent
    position = {id(m): i for i, m in enumerate(handled)}
    for ctl_id, queued in overtaken.items():
        for data in queued:
            if id(data) in position:
                assert position[ctl_id] < position[id(data)]
    # exactly once: nothing handled twice, and every sent message has exactly one fate
    assert len(handled) == len(set(map(id, handled)))
    fates = [*handled, *dropped, *refused, *(d.message for d in system.dead_letters)]
    assert sorted(map(id, fates)) == sorted(map(id, sent))
    # per-sender FIFO within a lane
    for lane_type in (Data, Ctl):
        for s in range(len(senders)):
            seqs = [m.seq for m in handled if isinstance(m, lane_type) and m.sender == s]
            assert seqs == sorted(seqs)
    # counted drops agree with what the hook saw
    counted = registry.counter("duplex_mailbox_dropped_total", "", ["actor", "lane", "reason"])
    total = sum(
        counted.value(actor="Probe", lane="data", reason=r) for r in ("overflow", "coalesced")
    )
    assert total == len(dropped)
    if overflow is Overflow.BLOCK:
        assert dropped == [] and refused == []


async def test_control_overtakes_a_flood_of_data(autojump_clock: trio.testing.MockClock) -> None:
    handled: list[Any] = []
    async with open_actor_system(registry=MetricsRegistry()) as system:
        ref = await system.spawn(Probe, handled, name="p")
        await ref.tell(Data(0, 0, work=1.0))  # keeps the actor busy while the flood queues
        await trio.sleep(0.5)
        for seq in range(1, 500):
            ref.tell_nowait(Data(0, seq))
        await ref.tell(Ctl(1, 0))
        await trio.sleep(2)
    assert handled[0] == Data(0, 0, work=1.0)
    assert handled[1] == Ctl(1, 0)
    assert [m.seq for m in handled[2:]] == list(range(1, 500))
