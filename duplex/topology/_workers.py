"""Connection workers, seen from a session process: spawned, supervised, relayed.

With ``server.connection_workers = N`` the server process binds the port and
runs no HTTP server itself: N worker processes (``_frontend.py``) accept on the
shared listener and do the WebSocket I/O, JSON and base64 of their sockets.
Sessions, connection actors, the engine and admission stay in the session
process (the server, or with session shards each shard: ``LinkServer`` serves
the links in both), exactly as without workers; each worker socket is a
``LinkedSocket`` under an ordinary connection actor. So resume and takeover
work across workers, and a worker that dies costs its sockets only: their
sessions wait out ``disconnect_grace_s`` for a resume while it is restarted.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import trio

from duplex.config import ServerConfig
from duplex.logs import get_logger
from duplex.metrics import Family, MetricsRegistry
from duplex.sessions import ServerEvent, SessionOptions
from duplex.transport import AccessSettings, HttpRoute, HubBackend, Received, SocketGone

from ._children import ChildQueries, Children, spawn_linked
from ._link import (
    AsgiEnd,
    AsgiIn,
    AsgiOpen,
    AsgiWritten,
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
    Tally,
    ToSocket,
    Window,
    Written,
)
from ._relay import RelayServer


def worker_access(access: AccessSettings, workers: int) -> AccessSettings:
    """One connection worker's share of the wrong-credential budget.

    ``auth_failure_burst`` is the server's: each worker counts a peer's wrong keys on its own
    (its Guard sees only the connections the kernel hands it), so each gets
    ``burst // workers`` of them (at least one) and a peer whose connections land on every
    worker still gets at most the server's burst before ``rate_limited``. Each worker's window
    is stretched so that, all together, they forgive one failure every
    ``auth_failure_window_s / auth_failure_burst`` seconds, as one process does.
    """
    if workers <= 1:
        return access
    share = max(1, access.failure_burst // workers)
    window = access.failure_window_s * share * workers / access.failure_burst
    return replace(access, failure_burst=share, failure_window_s=window)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What a worker needs of the config (its command line carries it as JSON): the
    ``[server]`` section whole, and of the others only what its sockets use (never the
    API keys: a command line is readable)."""

    server: ServerConfig
    """Frame limit, shutdown grace, logs, and the first-event timeout (with shards, a worker
    holds a socket until its first event says where it goes)."""
    fingerprint: str
    """The server process's ``CODE_FINGERPRINT``."""
    realtime_vad: str = "silero"
    agent: bool = False
    """``agent.enabled``: ``?duplex=1`` Realtime sessions open turn-based (the agent answers)."""
    shard_paths: tuple[str, ...] = ()
    """The Unix sockets of session shards 1.. (shard 0 is the server, over the worker's link)."""
    access: AccessSettings = field(default_factory=AccessSettings)
    """Who may connect; API keys travel as digests only (a command line is readable)."""
    client_secret_ttl_s: int = 600
    tls_certfile: str = ""
    tls_keyfile: str = ""
    robot_payload_bytes: int = 0
    """The robot endpoint's frame limit (a policy is served, relayed to the server)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSettings:
        fields = json.loads(text)
        fields["server"] = ServerConfig(**fields["server"])
        fields["shard_paths"] = tuple(fields.get("shard_paths", ()))
        access = {
            key: tuple(value) if isinstance(value, list) else value
            for key, value in fields.get("access", {}).items()
        }
        fields["access"] = AccessSettings(**access)
        return cls(**fields)


class LinkedSocket:
    """A client socket held by a worker, as the connection actor sees it."""

    def __init__(self, link: Link, conn: int, initial_options: SessionOptions | None) -> None:
        self.link = link
        self.conn = conn
        self._initial_options = initial_options
        self._inbox_in, self._inbox = trio.open_memory_channel[Received](math.inf)
        self._consumed = Tally()
        self.window = Window()  # frames the worker has not yet written
        self._closed = False
        self._peer_left = False
        self._peer_close: tuple[int | None, str] = (None, "")

    @property
    def open(self) -> bool:
        return not self._closed and not self.window.closed

    @property
    def initial_options(self) -> SessionOptions | None:
        return self._initial_options

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        """The code and reason the worker's peer closed with, as the worker read them off the
        wire (``None`` code: it sent no close, or the link went first)."""
        return self._peer_close if self._peer_left else None

    def deliver(self, received: Received, peer_close: tuple[int | None, str] | None = None) -> None:
        """A frame from the worker (bounded there by our credits); ``None``: the peer left
        (``peer_close``: with which code and reason)."""
        if received is None:
            self.peer_left(peer_close)
            return
        self._inbox_in.send_nowait(received)

    def peer_left(self, peer_close: tuple[int | None, str] | None = None) -> None:
        if peer_close is not None and not self._peer_left:
            self._peer_close = peer_close
        self._peer_left = True
        self.window.close()
        self._inbox_in.close()

    async def receive(self) -> Received:
        try:
            received = await self._inbox.receive()
        except trio.EndOfChannel:
            return None
        credits = self._consumed.add()
        if credits:
            self.link.post(Consumed(self.conn, credits))
        return received

    async def send(self, event: ServerEvent, seq: int | None) -> None:
        if not await self.window.take():
            raise SocketGone
        self.link.post(ToSocket(self.conn, event, seq))

    async def close(self, code: int, reason: str) -> None:
        if self.open:
            self._closed = True
            self.link.post(CloseRemoteSocket(self.conn, code, reason))


class ConnectionWorkers:
    """Spawns ``count`` workers on ``listener`` and keeps them running until ``stop``."""

    kind = "connection worker"

    def __init__(
        self,
        server: LinkServer,
        listener: socket.socket,
        count: int,
        settings: WorkerSettings,
        registry: MetricsRegistry,
    ) -> None:
        self.server = server
        self.listener = listener
        self.settings = settings
        self.children = Children(
            self,
            range(count),
            reap_after_s=settings.server.shutdown_grace_s + 2,
            restarts=registry.counter(
                "duplex_connection_worker_restarts_total",
                "Connection workers restarted after exiting",
            ),
            serving=registry.gauge(
                "duplex_connection_workers_serving", "Connection workers accepting connections"
            ),
        )
        self.queries = ChildQueries(self.children)

    def starting(self) -> str | None:
        """How many workers serve while they start one after another; ``None`` once all
        have served."""
        if self.children.started:
            return None
        return f"{len(self.children.ready)} of {len(self.children.indices)} serving"

    async def spawn(self, index: int) -> tuple[trio.Process, Link]:
        listen_fd = self.listener.fileno()
        settings = self.settings.to_json()
        args = [f"--index={index}", f"--listen-fd={listen_fd}", f"--settings={settings}"]
        return await spawn_linked("duplex.topology._frontend", args, pass_fds=(listen_fd,))

    async def serve(self, index: int, link: Link, on_ready: Callable[[], None]) -> None:
        await self.server.serve(
            link,
            on_ready=on_ready,
            on_answer=partial(self.queries.answered, index),
            name=f"worker {index}",
        )

    async def metrics(self) -> list[tuple[dict[str, str], list[Family]]]:
        """Each serving worker's own families (its HTTP boundary: connections, shed and
        refused requests), with a ``worker`` label for `merge_labelled`."""
        answers = await self.queries.ask("metrics")
        return [({"worker": str(index)}, answers[index]) for index in sorted(answers)]


class LinkServer:
    """A session process's end of its links: each socket on one runs under a connection actor.

    The server process serves its workers' links; a session shard serves the links
    its workers open to it. Every link hears the process's ``Load`` whenever the
    number of admitted sessions changes, so workers can place new sessions.

    ``relayed``: the ASGI app of the routes workers relay whole (``_relay.py``: speech,
    images, videos, robots), on the server process; ``None`` on a shard (workers relay none there).
    """

    def __init__(
        self, backend: HubBackend, registry: MetricsRegistry, relayed: Any | None = None
    ) -> None:
        self.backend = backend
        self.relayed = relayed
        self.links: set[Link] = set()
        self.log = get_logger(component="links")
        self._link_ended = trio.lowlevel.ParkingLot()
        self._sockets = registry.gauge(
            "duplex_connection_worker_sockets", "Client sockets open in connection workers"
        )
        backend.hub.watch_load(self._post_load)

    async def wait_unlinked(self) -> None:
        """Until no link is left (a stopping shard waits for its workers to finish)."""
        while self.links:
            await self._link_ended.park()

    def load(self) -> Load:
        hub = self.backend.hub
        return Load(hub.admission.statistics().live, hub.capacity())

    def _post_load(self) -> None:
        load = self.load()
        for link in self.links:
            link.post(load)

    async def serve(
        self,
        link: Link,
        *,
        on_ready: Callable[[], None] | None = None,
        on_answer: Callable[[int, Any], None] | None = None,
        name: str = "",
    ) -> None:
        """Deliver the link's messages until it ends, then end its connections.

        A broken link (bytes that are not our messages: a worker of another version,
        say) ends it too: we close our end, so the worker sees EOF, closes its sockets
        (1011) and exits or reconnects.
        """
        sockets: dict[int, LinkedSocket] = {}
        backend = self.backend

        async def connection(
            conn: int,
            socket: LinkedSocket,
            autostart: bool,
            waited: float,
            peer: str | None,
            endpoint: str | None,
        ) -> None:
            self._sockets.inc()
            try:
                await backend.connect(
                    socket, autostart=autostart, peer=peer, waited_s=waited, endpoint=endpoint
                )
            finally:
                sockets.pop(conn, None)
                self._sockets.dec()

        async def answer(request: int, route: HttpRoute, body: bytes) -> None:
            link.post(HttpReply(request, await backend.http(route, body)))

        self.links.add(link)
        link.post(self.load())
        try:
            async with trio.open_nursery() as nursery:
                relay = RelayServer(self.relayed, link, nursery) if self.relayed else None
                try:
                    async for message in link.messages():
                        match message:
                            case FromSocket(conn, received, peer_close):
                                if (linked := sockets.get(conn)) is not None:
                                    linked.deliver(received, peer_close)
                            case Written(conn, count):
                                if (linked := sockets.get(conn)) is not None:
                                    linked.window.give(count)
                            case Connected(conn, autostart, options, waited, peer, endpoint):
                                sockets[conn] = linked = LinkedSocket(link, conn, options)
                                nursery.start_soon(
                                    connection, conn, linked, autostart, waited, peer, endpoint
                                )
                            case HttpRequest(request, route, body):
                                nursery.start_soon(answer, request, route, body)
                            case AsgiOpen() | AsgiIn() | AsgiWritten() | AsgiEnd() if relay:
                                relay.on_message(message)
                            case Ready() if on_ready is not None:
                                on_ready()
                            case ShardAnswer(request, value) if on_answer is not None:
                                on_answer(request, value)
                except LinkBroken as exc:
                    self.log.error("link broken", link=name, error=str(exc))
                    await link.stream.aclose()
                finally:
                    for linked in sockets.values():
                        linked.peer_left()
                    if relay is not None:
                        relay.end_all()
        finally:
            self.links.discard(link)
            self._link_ended.unpark_all()
