"""The HTTP boundary's own pieces, over real socket pairs (no server)."""

from __future__ import annotations

import contextlib

import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.worker_context import WorkerContext

from duplex.transport._http import _Connection


async def _close_while_a_writer_sends() -> None:
    a, b = trio.socket.socketpair()
    stream = trio.SocketStream(a)
    conn = _Connection(None, HypercornConfig(), WorkerContext(None), {}, stream)  # type: ignore[arg-type]
    go = trio.Event()

    async def writer() -> None:  # hypercorn's protocol_send: the lock, then send_all
        async with conn.send_lock:
            await go.wait()
            # hypercorn takes these two for a closed connection
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await stream.send_all(b"x" * 100)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()  # the writer holds the lock
        nursery.start_soon(conn._close)
        go.set()  # the close and the send now run in either order
    b.close()


async def test_the_eof_never_races_a_writer() -> None:
    """hypercorn sent EOF outside its send lock: a send at that moment raised
    BusyResourceError, which ended the server (or an actor, with a traceback). The
    order of the two depends on trio's scheduler: hypercorn's own close failed 20
    of 40 tries here, so 40 tries leave it no chance to pass."""
    for _ in range(40):
        await _close_while_a_writer_sends()
