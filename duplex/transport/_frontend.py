"""A connection worker process: hypercorn on the shared listener, relaying to the session process.

    python -m duplex.transport._frontend --index I --listen-fd L --link-fd K --settings JSON

Spawned by ``ConnectionWorkers`` (``_workers.py``), never by hand. It runs the
same Starlette app as a single-process server over a ``LinkBackend``: each
WebSocket is decoded and encoded here by its wire projection, and its events
cross the link; HTTP routes are answered by the session process. The worker
owns no session state: when the session process goes away it closes its
sockets with 1011 and exits; SIGINT is left to the session process, which
stops the workers in order (sockets closed with 1001 first).
"""

from __future__ import annotations

import argparse
import gc
import math
import signal
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.trio import serve

from duplex.logs import configure_logging, get_logger

from ._app import HttpRoute, Reply, build_app, hypercorn_config
from ._link import (
    CODE_FINGERPRINT,
    EXIT_STALE_CODE,
    CloseConnection,
    Connected,
    Consumed,
    FromSocket,
    HttpReply,
    HttpRequest,
    Link,
    Ready,
    Stop,
    Tally,
    ToSocket,
    Window,
    Written,
)
from ._sockets import EventSocket, SocketGone
from ._workers import WorkerSettings

HTTP_TIMEOUT_S = 5.0
"""How long an HTTP route waits for the session process before answering 503."""


class Relay:
    """One socket of this worker: its credits both ways and the frames the session sent it."""

    def __init__(self, conn: int, socket: EventSocket) -> None:
        self.conn = conn
        self.socket = socket
        self.window = Window()  # frames read that the session process has not taken yet
        self.written = Tally()
        self.post, self.outbox = trio.open_memory_channel[ToSocket | CloseConnection](math.inf)


@dataclass
class _Answer:
    done: trio.Event = field(default_factory=trio.Event)
    reply: Reply | None = None


class LinkBackend:
    """The routes' backend in a worker: the session process, over the link."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.relays: dict[int, Relay] = {}
        self.answers: dict[int, _Answer] = {}
        self._next_conn = 0
        self._next_request = 0

    async def http(self, route: HttpRoute) -> Reply:
        request, self._next_request = self._next_request, self._next_request + 1
        self.answers[request] = answer = _Answer()
        self.link.post(HttpRequest(request, route))
        try:
            with trio.move_on_after(HTTP_TIMEOUT_S):
                await answer.done.wait()
        finally:
            del self.answers[request]
        if answer.reply is None:
            return Reply.json({"status": "unavailable", "detail": "no session process"}, 503)
        return answer.reply

    async def connect(self, socket: EventSocket, *, autostart: bool) -> None:
        conn, self._next_conn = self._next_conn, self._next_conn + 1
        self.relays[conn] = relay = Relay(conn, socket)
        self.link.post(Connected(conn, autostart, socket.initial_options))
        try:
            async with trio.open_nursery() as nursery:

                async def then_end(part: Any) -> None:
                    await part(relay)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(then_end, self._read)
                nursery.start_soon(then_end, self._write)
        finally:
            del self.relays[conn]

    async def _read(self, relay: Relay) -> None:
        while await relay.window.take():
            received = await relay.socket.receive()
            self.link.post(FromSocket(relay.conn, received))
            if received is None:
                return

    async def _write(self, relay: Relay) -> None:
        async for message in relay.outbox:
            if isinstance(message, CloseConnection):
                await relay.socket.close(message.code, message.reason)
                return
            try:
                await relay.socket.send(message.event, message.seq)
            except SocketGone:  # the peer left: say so here, as the reader is cancelled now
                relay.window.close()
                self.link.post(FromSocket(relay.conn, None))
                return
            credits = relay.written.add()
            if credits:
                self.link.post(Written(relay.conn, credits))

    def route(self, message: object) -> None:
        """One message from the session process."""
        match message:
            case ToSocket(conn) | CloseConnection(conn):
                if (relay := self.relays.get(conn)) is not None:
                    relay.post.send_nowait(message)
            case Consumed(conn, count):
                if (relay := self.relays.get(conn)) is not None:
                    relay.window.give(count)
            case HttpReply(request, reply):
                if (answer := self.answers.get(request)) is not None:
                    answer.reply = reply
                    answer.done.set()

    def session_process_gone(self) -> None:
        for conn, relay in self.relays.items():
            relay.post.send_nowait(CloseConnection(conn, 1011, "internal_error"))


async def run_worker(index: int, listen_fd: int, link_fd: int, settings: WorkerSettings) -> None:
    log = get_logger(component="frontend", worker=index)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=link_fd)))
    link = Link(stream)
    backend = LinkBackend(link)
    app = build_app(
        backend, max_frame_bytes=settings.max_frame_bytes, realtime_vad=settings.realtime_vad
    )
    hyper = hypercorn_config(
        f"fd://{listen_fd}",
        max_frame_bytes=settings.max_frame_bytes,
        graceful_timeout_s=settings.shutdown_grace_s,
    )
    stopping = trio.Event()

    async def listen() -> None:
        async for message in link.messages():
            if isinstance(message, Stop):
                stopping.set()
            else:
                backend.route(message)
        if not stopping.is_set():
            log.error("session process gone; closing sockets")
            backend.session_process_gone()
            stopping.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.send_loop)
        nursery.start_soon(listen)

        async def serve_then_end(*, task_status: trio.TaskStatus[Any]) -> None:
            await serve(app, hyper, shutdown_trigger=stopping.wait, task_status=task_status)
            nursery.cancel_scope.cancel()

        await nursery.start(serve_then_end)
        gc.collect()
        gc.freeze()  # imports and app: long-lived, never garbage (see freeze_startup_objects)
        link.post(Ready())
        log.debug("serving")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--settings", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session process stops us in order
    settings = WorkerSettings.from_json(args.settings)
    configure_logging(settings.log_format, settings.log_level)  # type: ignore[arg-type]
    if settings.fingerprint != CODE_FINGERPRINT:
        get_logger(component="frontend", worker=args.index).error(
            "duplex's code on disk changed since the server started; not starting"
        )
        return EXIT_STALE_CODE
    trio.run(run_worker, args.index, args.listen_fd, args.link_fd, settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
