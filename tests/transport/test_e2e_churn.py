"""Closed sessions leave nothing behind: no session machine outlives its session.

Sessions closed while their audio is still flowing get engine outputs sent after
they stopped (dead letters). A kept dead letter held the session's sink, actor
and machine; with the actor system's default of 1000 kept, closed sessions piled
up under churn (docs/reliability.md, ``bench/churn.py``). The server keeps none.
"""

from __future__ import annotations

import gc

import trio

from duplex.sessions import SessionMachine

from .wsclient import client, running_server, tone


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
        await trio.sleep(0.5)  # the last outputs reach the stopped session
        with trio.fail_after(5):  # actors finish stopping a little after the close
            while live_machines():
                await trio.sleep(0.05)
        assert len(server.system.paths()) < 10  # no session or connection actor left
