"""The session actor's one end path for a session its machine did not end.

A crash, a restarted engine with no slot for the session, and a restarted VAD with
no stream for it all end the same way (`SessionActor._end_lost`): the session's
slot and VAD stream are freed, the hub is told once, every attached socket gets an
``internal_error`` and a 1011 close, and the actor stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import trio

from duplex import sessions as ds
from duplex.actors import (
    ActorRef,
    ActorSystem,
    Restart,
    open_actor_system,
)
from duplex.models import EngineDriver, ModelSpec, SlotOutput, silero_engine
from duplex.models._driver import inline
from duplex.runtime._actor import (
    Attach,
    CloseSocket,
    EngineReplaced,
    FromClient,
    Outbound,
    SessionActor,
    SessionResources,
    VadReplaced,
    VadResources,
    engine_sink,
    vad_sink,
)
from duplex.runtime._vad_link import VadLink

from ..models.models_support import loopback_engine
from .session_fakes import Hub, Socket

SPEC = ModelSpec(name="loopback", max_slots=1)


@dataclass
class Running:
    ref: ActorRef[Any]
    told: list[object]
    hub: Hub
    driver: EngineDriver
    vad: EngineDriver
    session_id: str


async def start(system: ActorSystem) -> Running:
    """A silero session on a one-slot loopback engine and a one-slot VAD engine, one socket."""
    driver = EngineDriver(loopback_engine(spec=SPEC), offload=inline)
    vad_driver = EngineDriver(silero_engine(1), offload=inline)
    machine = ds.SessionMachine(ds.SessionConfig(vad="silero"))
    sid = machine.session_id
    sink = engine_sink(8)
    handle = driver.attach(sid, sink)
    windows = vad_sink()
    vad_handle = vad_driver.attach(sid, windows)
    assert handle is not None and vad_handle is not None
    vad = VadResources(VadLink(vad_driver, vad_handle, machine.config), windows)
    hub = Hub()
    resources = SessionResources(driver, handle, sink, vad=vad)
    ref = await system.spawn(  # as the hub spawns it
        SessionActor,
        machine,
        resources,
        hub,
        name=sid,
        restart=Restart.TEMPORARY,
        lanes=SessionActor.lanes_for(machine.config),
    )
    told: list[object] = []
    socket = await system.spawn(Socket, told)
    await ref.tell(Attach(1, socket))
    return Running(ref, told, hub, driver, vad_driver, sid)


def full_engine() -> EngineDriver:
    driver = EngineDriver(loopback_engine(spec=SPEC), offload=inline)
    assert driver.attach("someone else", engine_sink(8)) is not None
    return driver  # no slot left for the session


def full_vad() -> EngineDriver:
    vad = EngineDriver(silero_engine(1), offload=inline)
    send, _ = trio.open_memory_channel[SlotOutput](1)
    assert vad.attach("someone else", send) is not None
    return vad


ENDS = {
    "actor_stopped": lambda: FromClient(1, object()),  # no table row: the actor crashes
    "engine_restart_no_slot": lambda: EngineReplaced(full_engine(), "engine crashed"),
    "vad_restart_no_stream": lambda: VadReplaced(full_vad()),
}


@pytest.mark.parametrize("reason", list(ENDS))
async def test_every_lost_session_ends_the_same_way(
    reason: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_actor_system() as system:
        s = await start(system)
        with trio.fail_after(5):
            while not any(isinstance(m, Outbound) for m in s.told):  # session.created
                await trio.sleep(0.01)
        await s.ref.tell(ENDS[reason]())
        with trio.fail_after(5):
            await s.ref.wait_stopped()
            while not any(isinstance(m, CloseSocket) for m in s.told):
                await trio.sleep(0.01)
    assert s.hub.released_ids == [s.session_id]  # told once
    assert s.driver.statistics().engine.live_slots == 0  # its slot was given back
    assert s.vad.statistics().engine.live_slots == 0  # and its VAD slot
    *_, error, close = s.told
    assert isinstance(error, Outbound) and error.seq is None
    assert isinstance(error.event, ds.ErrorEvent) and error.event.code == "internal_error"
    assert close == CloseSocket(1011, "internal_error")
