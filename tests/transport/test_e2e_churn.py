"""Closed sessions leave nothing behind: no session machine outlives its session.

Sessions closed while their audio is still flowing get engine outputs sent after
they stopped (dead letters). A kept dead letter held the session's sink, actor
and machine; with the actor system's default of 1000 kept, closed sessions piled
up under churn (docs/reliability.md, ``bench/churn.py``). The server keeps none.
"""

from __future__ import annotations

import gc

import trio

from duplex.runtime._actor import SessionActor
from duplex.sessions import Journal, SessionMachine

from ..helpers import parse_metrics, wait_until
from .wsclient import Server, client, running_server, tone


async def outputs_settled(server: Server) -> None:
    """Until no output for a closed session can still come: the engine holds no slot (a
    detached slot gets no more deliveries) and every session and connection actor has
    stopped (what was left in their mailboxes went to the dead letters as they did)."""

    def settled() -> bool:
        slots = parse_metrics(server.registry.render()).sum("duplex_engine_live_slots")
        return slots == 0 and len(server.system.paths()) < 10

    await wait_until(settled, timeout_s=10, what="engine slots released, actors stopped")


def live_machines() -> int:
    gc.collect()
    return sum(type(o) is SessionMachine for o in gc.get_objects())


async def test_sessions_closed_mid_stream_are_freed() -> None:
    async with running_server(**{"session.overlap_policy": "model"}) as server:
        assert server.system.dead_letters.maxlen == 0  # as served
        for _ in range(6):
            async with client(server) as c:
                await c.send({"type": "session.create"})
                await c.until("session.created")
                await c.stream(tone(6), realtime=False)  # queued: outputs still coming
                await c.until("response.audio.delta")
                await c.send({"type": "session.close"})
                await c.until("session.closed")
        await outputs_settled(server)
        with trio.fail_after(5):  # actors finish stopping a little after the close
            while live_machines():
                await trio.sleep(0.05)
        assert len(server.system.paths()) < 10  # no session or connection actor left


async def _resumed_mid_stream(server: Server) -> None:
    """What ``bench/soak.py``'s clients do: speak, drop the socket while the answer
    streams, resume on a new one, speak again and close while that answer streams."""
    async with client(server) as c:
        await c.send({"type": "session.create"})
        created = await c.until("session.created")
        await c.stream(tone(6), realtime=False)
        await c.until("response.audio.delta")
        cursor = max(e.get("server_event_seq") or 0 for e in c.events)
    async with client(server) as c:  # the first socket closed without session.close
        await c.send(
            {
                "type": "session.resume",
                "session_id": created["session"]["id"],
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": cursor,
            }
        )
        await c.until("session.resumed")
        await c.stream(tone(6), realtime=False)
        await c.until("response.audio.delta")
        await c.send({"type": "session.close"})
        await c.until("session.closed")


async def test_sessions_resumed_and_closed_mid_stream_are_freed() -> None:
    """The soak's sessions (audio, responses, a drop and a resume, a close mid-answer)
    leave no session machine, journal or actor behind. With the dead letters an actor
    system kept by default (1000), each such session stayed in memory: the 30-minute
    soak's RSS and objects grew (docs/reliability.md, "Soak")."""
    async with running_server(**{"session.overlap_policy": "model"}) as server:
        for _ in range(4):
            await _resumed_mid_stream(server)
        await outputs_settled(server)
        with trio.fail_after(5):  # actors finish stopping a little after the close
            while live_machines():
                await trio.sleep(0.05)
        gc.collect()
        assert not [o for o in gc.get_objects() if type(o) in (Journal, SessionActor)]
        assert len(server.system.paths()) < 10
