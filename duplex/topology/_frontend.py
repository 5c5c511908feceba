"""A connection worker process: hypercorn on the shared listener, relaying to the session processes.

    python -m duplex.topology._frontend --index I --listen-fd L --link-fd K --settings JSON

Spawned by ``ConnectionWorkers`` (``_workers.py``), never by hand. It runs the
same Starlette app as a single-process server over a ``LinkBackend``: each
WebSocket is decoded and encoded here by its wire projection, and its events
cross the link; HTTP routes are answered by the session process, and the
generation routes (speech, images, videos) are relayed whole to the server
process as ASGI messages (``_relay.py``). The worker
owns no session state (its HTTP boundary's metrics are its own: the server's ``/metrics``
asks for them, ``ShardQuery("metrics")``): when the session process goes away it closes its
sockets with 1011 and exits; SIGINT and SIGTERM are left to the session process, which
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

from duplex.logs import configure_logging, get_logger
from duplex.metrics import REGISTRY
from duplex.sessions import SessionResume, shard_of
from duplex.transport import (
    EventSocket,
    HttpAnswer,
    HttpRoute,
    SocketGone,
    build_app,
    hypercorn_config,
    relayed,
    serve_http,
)

from ._link import (
    CODE_FINGERPRINT,
    EXIT_STALE_CODE,
    AsgiEnd,
    AsgiOut,
    AsgiPull,
    CloseRemoteSocket,
    Connected,
    Consumed,
    FromSocket,
    HttpReply,
    HttpRequest,
    Link,
    LinkBroken,
    Load,
    Ready,
    ShardAnswer,
    ShardQuery,
    Stop,
    Tally,
    ToSocket,
    Window,
    Written,
)
from ._relay import RelayClient
from ._routes import robot_limits, service_routes
from ._workers import WorkerSettings

HTTP_TIMEOUT_S = 5.0
"""How long an HTTP route waits for the session process before answering 503."""

SHARD_RETRY_S = 0.2
"""Pause between tries to reach a session shard that is down (restarting)."""


class Relay:
    """One socket of this worker: its shard's link, credits both ways, frames sent to it."""

    def __init__(self, conn: int, socket: EventSocket, link: Link, shard: int) -> None:
        self.conn = conn
        self.socket = socket
        self.link = link
        self.shard = shard
        self.window = Window()  # frames read that the session process has not taken yet
        self.written = Tally()
        self.post, self.outbox = trio.open_memory_channel[ToSocket | CloseRemoteSocket](math.inf)


@dataclass
class _Answer:
    done: trio.Event = field(default_factory=trio.Event)
    reply: HttpAnswer | None = None


@dataclass
class ShardLink:
    """One session shard as this worker sees it: its link (``None`` while it is down) and
    its last ``Load``."""

    index: int
    link: Link | None = None
    live: int = 0
    capacity: int = 0


_NOTHING = object()


class LinkBackend:
    """The routes' backend in a worker: the session processes, over links.

    Shard 0 is the server process, over the link the worker was spawned with; it
    answers HTTP. Other shards are reached on their Unix sockets. With one shard
    every socket goes to it at once; with several, a socket opens on the shard with
    the most room, or (``/v1/duplex`` and ``?resume=1``) is held here until its
    first event: a ``session.resume`` goes to the shard its session id names.
    """

    def __init__(self, link: Link, shard_count: int = 1, first_event_timeout_s: float = 0.0):
        self.link = link
        self.shards = [ShardLink(0, link), *(ShardLink(i) for i in range(1, shard_count))]
        self.first_event_timeout_s = first_event_timeout_s
        self.relays: dict[int, Relay] = {}
        self.held: set[EventSocket] = set()
        """Sockets held for their first event: no shard has them yet, so we close them."""
        self.answers: dict[int, _Answer] = {}
        self.relay = RelayClient(link)
        """The generation routes, run in the server process (shard 0)."""
        self._next_conn = 0
        self._next_request = 0

    async def http(self, route: HttpRoute, body: bytes = b"") -> HttpAnswer:
        request, self._next_request = self._next_request, self._next_request + 1
        self.answers[request] = answer = _Answer()
        self.link.post(HttpRequest(request, route, body))
        try:
            with trio.move_on_after(HTTP_TIMEOUT_S):
                await answer.done.wait()
        finally:
            del self.answers[request]
        if answer.reply is None:
            return HttpAnswer.json({"status": "unavailable", "detail": "no session process"}, 503)
        return answer.reply

    async def connect(
        self,
        socket: EventSocket,
        *,
        autostart: bool,
        peer: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        placed = await self._place(socket, autostart)
        if placed is None:  # the peer left before it said anything
            return
        shard, first, waited = placed
        conn, self._next_conn = self._next_conn, self._next_conn + 1
        assert shard.link is not None
        self.relays[conn] = relay = Relay(conn, socket, shard.link, shard.index)
        options = socket.initial_options
        relay.link.post(Connected(conn, autostart, options, waited, peer, endpoint))
        if first is not _NOTHING:
            await relay.window.take()  # the first of a fresh window: never waits
            relay.link.post(FromSocket(conn, first))  # type: ignore[arg-type]
        try:
            async with trio.open_nursery() as nursery:

                async def then_end(part: Any) -> None:
                    await part(relay)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(then_end, self._read)
                nursery.start_soon(then_end, self._write)
        finally:
            del self.relays[conn]

    async def _place(
        self, socket: EventSocket, autostart: bool
    ) -> tuple[ShardLink, object, float] | None:
        """The socket's shard, its first frame if it was read to choose (else ``_NOTHING``)
        and the seconds that took; ``None`` when the peer left first."""
        if len(self.shards) == 1:
            return self.shards[0], _NOTHING, 0.0
        if autostart:
            return self._roomiest(), _NOTHING, 0.0
        first: object = _NOTHING
        began = trio.current_time()
        self.held.add(socket)
        try:
            with trio.move_on_after(self.first_event_timeout_s or math.inf):
                first = await socket.receive()
        finally:
            self.held.discard(socket)
        waited = trio.current_time() - began
        if first is None:
            return None
        if first is _NOTHING:  # silent past the timeout: shard 0 says so, and no shard
            return self.shards[0], first, waited  # counts it as a new session
        return self._owner(first), first, waited

    def _roomiest(self) -> ShardLink:
        """The reachable shard with the most free sessions, counted taken at once."""
        shard = max(
            (s for s in self.shards if s.link is not None), key=lambda s: s.capacity - s.live
        )
        shard.live += 1  # until its next Load says how many it really has
        return shard

    def _owner(self, first: object) -> ShardLink:
        if isinstance(first, SessionResume):
            index = shard_of(first.session_id)
            if index is not None and index < len(self.shards):
                shard = self.shards[index]
                if shard.link is not None:
                    return shard
            return self.shards[0]  # gone with its shard, or never ours: it says so
        return self._roomiest()

    async def _read(self, relay: Relay) -> None:
        while await relay.window.take():
            received = await relay.socket.receive()
            left = relay.socket.peer_close if received is None else None
            relay.link.post(FromSocket(relay.conn, received, left))
            if received is None:
                return

    async def _write(self, relay: Relay) -> None:
        async for message in relay.outbox:
            if isinstance(message, CloseRemoteSocket):
                await relay.socket.close(message.code, message.reason)
                return
            try:
                await relay.socket.send(message.event, message.seq)
            except SocketGone:  # the peer left: say so here, as the reader is cancelled now
                relay.window.close()
                relay.link.post(FromSocket(relay.conn, None))
                return
            credits = relay.written.add()
            if credits:
                relay.link.post(Written(relay.conn, credits))

    def route(self, message: object, shard: int = 0) -> None:
        """One message from session shard ``shard``."""
        match message:
            case ToSocket(conn) | CloseRemoteSocket(conn):
                if (relay := self.relays.get(conn)) is not None:
                    relay.post.send_nowait(message)
            case Consumed(conn, count):
                if (relay := self.relays.get(conn)) is not None:
                    relay.window.give(count)
            case HttpReply(request, reply):
                if (answer := self.answers.get(request)) is not None:
                    answer.reply = reply
                    answer.done.set()
            case Load(live, capacity):
                self.shards[shard].live, self.shards[shard].capacity = live, capacity
            case AsgiPull() | AsgiOut() | AsgiEnd() if shard == 0:
                self.relay.on_message(message)

    async def close_held(self, code: int, reason: str) -> None:
        """Close the sockets still waiting for their first event (shutdown, server gone)."""
        for held in list(self.held):
            await held.close(code, reason)

    def shard_gone(self, shard: int | None = None) -> None:
        """Close the sockets of ``shard`` (``None``: of every shard) with 1011; the server
        process (shard 0) gone ends the requests relayed to it too."""
        for conn, relay in self.relays.items():
            if shard is None or relay.shard == shard:
                relay.post.send_nowait(CloseRemoteSocket(conn, 1011, "internal_error"))
        if not shard:
            self.relay.end_all()

    async def _receive(self, link: Link, index: int) -> None:
        """Route shard ``index``'s messages until its link ends."""
        try:
            async for message in link.messages():
                self.route(message, index)
        except LinkBroken as exc:
            get_logger(component="frontend", shard=index).error(
                "session shard link broken", error=str(exc)
            )

    async def keep_shard(
        self,
        index: int,
        path: str,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Stay connected to shard ``index``; reports after the first try."""
        log = get_logger(component="frontend", shard=index)
        shard = self.shards[index]
        reported = False
        while True:
            try:
                stream = await trio.open_unix_socket(path)
            except OSError:
                stream = None
            if not reported:
                reported = True
                task_status.started()
            if stream is None:
                await trio.sleep(SHARD_RETRY_S)
                continue
            link = shard.link = Link(stream)
            try:
                await link.while_sending(self._receive, link, index)
            finally:
                shard.link, shard.live, shard.capacity = None, 0, 0
                self.shard_gone(index)
                await link.stream.aclose()
            log.error("session shard gone; closed its sockets, reconnecting")
            await trio.sleep(SHARD_RETRY_S)


async def run_worker(index: int, listen_fd: int, link_fd: int, settings: WorkerSettings) -> None:
    log = get_logger(component="frontend", worker=index)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=link_fd)))
    link = Link(stream)
    backend = LinkBackend(
        link, 1 + len(settings.shard_paths), settings.server.first_event_timeout_s
    )
    app = build_app(
        backend,
        max_frame_bytes=settings.server.max_frame_bytes,
        realtime_vad=settings.realtime_vad,
        realtime_agent=settings.agent,
        access=settings.access,
        client_secret_ttl_s=settings.client_secret_ttl_s,
        registry=REGISTRY,
        routes=relayed(service_routes(None, None, None), backend.relay),
    )
    hyper = hypercorn_config(
        f"fd://{listen_fd}",
        max_frame_bytes=settings.server.max_frame_bytes,
        graceful_timeout_s=settings.server.shutdown_grace_s,
        tls_certfile=settings.tls_certfile,
        tls_keyfile=settings.tls_keyfile,
        message_limits=robot_limits(settings.robot_payload_bytes),
    )
    stopping = trio.Event()

    async def listen() -> None:
        async for message in link.messages():
            match message:
                case Stop():
                    stopping.set()
                    await backend.close_held(1001, "server_shutdown")
                case ShardQuery(request, "metrics"):  # the server's /metrics: ours too
                    link.post(ShardAnswer(request, REGISTRY.families()))
                case _:
                    backend.route(message)
        if not stopping.is_set():
            log.error("session process gone; closing sockets")
            backend.shard_gone()
            stopping.set()
            await backend.close_held(1011, "internal_error")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.send_loop)
        nursery.start_soon(listen)
        for shard, path in enumerate(settings.shard_paths, 1):
            await nursery.start(backend.keep_shard, shard, path)

        async def serve_then_end(*, task_status: trio.TaskStatus[Any]) -> None:
            await serve_http(
                app,
                hyper,
                shutdown_trigger=stopping.wait,
                announce=False,
                max_connections=settings.server.max_connections,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()

        await nursery.start(serve_then_end)
        gc.collect()
        gc.freeze()  # imports and app: long-lived, never garbage (see freeze_startup_objects)
        gc.collect()  # the collector's long-lived count reset (ditto)
        link.post(Ready())
        log.debug("serving")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--settings", required=True)
    args = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):  # to a process group: the server stops us
        signal.signal(signum, signal.SIG_IGN)
    settings = WorkerSettings.from_json(args.settings)
    configure_logging(settings.server.log_format, settings.server.log_level)
    if settings.fingerprint != CODE_FINGERPRINT:
        get_logger(component="frontend", worker=args.index).error(
            "duplex's code on disk changed since the server started; not starting"
        )
        return EXIT_STALE_CODE
    trio.run(run_worker, args.index, args.listen_fd, args.link_fd, settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
