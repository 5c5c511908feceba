"""A socket whose client reads nothing never holds its session.

The session posts to its socket's writer without waiting; when the writer's queue is
full (the client stopped reading), the session lets that socket go (1013
``client_not_reading`` once the writer is free), is detached, and stays resumable. It
used to wait for room, while the socket's reader waited for room in the session's
mailbox: each held the other, and a shutdown stopped such sessions one at a time.
"""

from __future__ import annotations

from typing import Any, ClassVar

import trio

from duplex import sessions as ds
from duplex.actors import Actor, ActorContext, LaneSpec, Restart, open_actor_system
from duplex.models import EngineDriver, ModelSpec
from duplex.models._driver import inline
from duplex.runtime._actor import (
    Attach,
    ClientNotReading,
    FromClient,
    Inspect,
    Outbound,
    SessionActor,
    SessionResources,
    engine_sink,
)

from ..models.models_support import loopback_engine
from .session_fakes import Hub, Socket

SPEC = ModelSpec(name="loopback", max_slots=1)


class StuckSocket(Actor[Any]):
    """A connection whose writer blocks on its first event, as on a client reading nothing."""

    lanes: ClassVar[tuple[LaneSpec, ...]] = (
        LaneSpec("control", capacity=4, priority=0),
        LaneSpec("data", capacity=2, priority=10),
    )

    def __init__(self, told: list[object], unblock: trio.Event) -> None:
        self.told = told
        self.unblock = unblock

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        self.told.append(message)
        await self.unblock.wait()


async def test_a_full_socket_queue_lets_the_socket_go_and_the_session_resumes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system() as system:
        driver = EngineDriver(loopback_engine(spec=SPEC), offload=inline)
        machine = ds.SessionMachine(ds.SessionConfig())
        sid = machine.session_id
        sink = engine_sink(8)
        handle = driver.attach(sid, sink)
        assert handle is not None
        hub = Hub()
        ref = await system.spawn(
            SessionActor,
            machine,
            SessionResources(driver, handle, sink),
            hub,
            name=sid,
            restart=Restart.TEMPORARY,
            lanes=SessionActor.lanes_for(machine.config),
        )
        stuck_told: list[object] = []
        unblock = trio.Event()
        stuck = await system.spawn(StuckSocket, stuck_told, unblock)
        await ref.tell(Attach(1, stuck))
        # each update is answered: the writer holds the first answer, its queue holds 2
        with trio.fail_after(5):
            for _ in range(8):
                await ref.tell(FromClient(1, ds.SessionUpdate()))
            while not hub.let_go_ids:
                await trio.sleep(0.01)
        assert hub.let_go_ids == [sid]
        session = await ref.ask(Inspect())
        assert ref.alive and session.generation is None  # detached, not ended
        assert hub.released_ids == []

        # the session answers the next socket at once: a resume takes it over
        told: list[object] = []
        fresh = await system.spawn(Socket, told)
        created = stuck_told[0]
        assert isinstance(created, Outbound) and isinstance(created.event, ds.SessionCreated)
        resume = ds.SessionResume(session_id=sid, resume_token=created.event.resume_token)
        await ref.tell(Attach(2, fresh, resume))
        with trio.fail_after(5):
            while not any(isinstance(m, Outbound) for m in told):
                await trio.sleep(0.01)
        assert session.generation == 2
        assert not any(isinstance(m.event, ds.ErrorEvent) for m in told if isinstance(m, Outbound))

        # and the stuck writer, once free, is told to close before its queued events
        unblock.set()
        with trio.fail_after(5):
            while not any(isinstance(m, ClientNotReading) for m in stuck_told):
                await trio.sleep(0.01)
        # the control lane first: the close comes before the events queued behind the first
        assert isinstance(stuck_told[1], ClientNotReading)
