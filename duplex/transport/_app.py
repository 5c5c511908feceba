"""The ASGI app: one Starlette app, one port, every route.

Routes are thin and ask a ``Backend`` for everything: ``HubBackend`` when the
sessions live in this process, a worker's link to the session process when
they do not (``_frontend.py``). HTTP handlers read runtime state; WebSocket
routes wrap the socket in its wire projection and hand it to the backend,
which runs its connection until it ends.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import trio
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from duplex import __version__
from duplex.actors import ActorRef, ActorSystem, Restart
from duplex.exceptions import ProtocolError
from duplex.metrics import MetricsRegistry, merge_labelled, render
from duplex.sessions import ErrorEvent
from duplex.sessions._hub import SessionHub

from ._connection import ConnectionActor, ShutDown
from ._duplex_wire import NativeProjection
from ._realtime_wire import RealtimeProjection, duplex_flag, schema_from_headers
from ._sockets import EventSocket, WebSocketEvents

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

HttpRoute = Literal["health", "models", "metrics"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer, as plain data (it crosses a worker's link)."""

    status: int
    media_type: str
    body: bytes

    @classmethod
    def json(cls, content: Any, status: int = 200) -> Reply:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return cls(status, JSON_CONTENT_TYPE, text.encode())

    def response(self) -> Response:
        return Response(self.body, status_code=self.status, media_type=self.media_type)


class Backend(Protocol):
    """What the routes need from the process that owns the sessions."""

    async def http(self, route: HttpRoute) -> Reply:
        """The answer to ``GET`` on one of the HTTP routes."""
        ...

    async def connect(self, socket: EventSocket, *, autostart: bool) -> None:
        """Run one client socket's connection until it ends."""
        ...


class Connections:
    """The live connection actors, so a shutdown can close every socket first (1001)."""

    def __init__(self, system: ActorSystem) -> None:
        self.system = system
        self.live: set[ActorRef[Any]] = set()
        self.closing = False
        self._none_left = trio.Event()

    async def close_all(self, within_s: float) -> None:
        """Close every socket, and from now on every socket that is still arriving.

        Every connection is told at once, so healthy peers get their 1001 in
        parallel and without waiting on anyone. A connection whose writer is
        stuck on a peer that reads nothing cannot act on it: after ``within_s``
        it is left to the HTTP server, which aborts its TCP connection.
        """
        self.closing = True
        for ref in list(self.live):
            with contextlib.suppress(trio.WouldBlock):  # a full control lane: left to the abort
                ref.tell_nowait(ShutDown())
        if self.live:
            with trio.move_on_after(within_s):
                await self._none_left.wait()

    async def add(self, ref: ActorRef[Any]) -> None:
        self.live.add(ref)
        if self.closing:  # accepted just as the shutdown began
            with contextlib.suppress(trio.WouldBlock):
                ref.tell_nowait(ShutDown())

    def remove(self, ref: ActorRef[Any]) -> None:
        self.live.discard(ref)
        if self.closing and not self.live:
            self._none_left.set()


class Shards(Protocol):
    """The server's other session shards, as its HTTP routes see them (``_shards.py``)."""

    async def query(self, what: str) -> list[Any]:
        """Each other shard's answer to ``what`` (``health``, ``metrics``); ``None``: no answer."""
        ...


class HubBackend:
    """The sessions of this process: one hub (engine + sessions), its connections, its metrics.

    With session shards (``shards`` set, on the server process, which is shard 0)
    the HTTP routes answer for every shard: health and metrics are gathered from
    the others; a child shard answers its own part (``health_of``, ``families``).
    """

    def __init__(
        self,
        hub: SessionHub,
        registry: MetricsRegistry,
        *,
        first_event_timeout_s: float = 0.0,
    ) -> None:
        """``first_event_timeout_s`` closes sockets that open no session in time (0: never)."""
        self.hub = hub
        self.registry = registry
        self.connections = Connections(hub.system)
        self.first_event_timeout_s = first_event_timeout_s
        self.shards: Shards | None = None

    def health_of(self) -> dict[str, Any]:
        """This process's own health."""
        hub = self.hub
        stats = hub.admission.statistics()
        return {
            "status": "ok" if hub.ready else "starting",
            "engine_starts": hub.engine_starts,
            "vad_starts": hub.vad_starts,
            "version": __version__,
            "model": hub.spec.name,
            "sessions": {"live": stats.live, "capacity": stats.capacity},
        }

    def reply(self, route: HttpRoute) -> Reply:
        """The answer for this process alone."""
        hub = self.hub
        if route == "health":
            health = self.health_of()
            return Reply.json(health, 200 if hub.ready else 503)
        if route == "models":
            card: dict[str, Any] = {
                "id": hub.spec.name,
                "object": "model",
                "owned_by": "duplex",
                "created": 0,
                "capabilities": hub.capabilities.as_dict(),
            }
            return Reply.json({"object": "list", "data": [card]})
        return Reply(200, PROMETHEUS_CONTENT_TYPE, self.registry.render().encode())

    async def http(self, route: HttpRoute) -> Reply:
        if self.shards is None or route == "models":
            return self.reply(route)
        answers = await self.shards.query(route)
        if route == "metrics":
            parts = [({"shard": "0"}, self.registry.families())]
            parts += [({"shard": str(i)}, a) for i, a in enumerate(answers, 1) if a is not None]
            return Reply(200, PROMETHEUS_CONTENT_TYPE, render(merge_labelled(parts)).encode())
        shards = [{"shard": 0, **self.health_of()}]
        for index, answer in enumerate(answers, 1):
            shards.append({"shard": index, **(answer or {"status": "unavailable"})})
        # this process takes sessions while any shard does; a restarting shard only degrades it
        status = "ok" if all(shard["status"] == "ok" for shard in shards) else "degraded"
        if shards[0]["status"] != "ok":
            status = shards[0]["status"]
        health = {
            "status": status,
            "version": __version__,
            "model": self.hub.spec.name,
            "sessions": {
                key: sum(shard.get("sessions", {}).get(key, 0) for shard in shards)
                for key in ("live", "capacity")
            },
            "shards": shards,
        }
        return Reply.json(health, 503 if status == "starting" else 200)

    async def connect(self, socket: EventSocket, *, autostart: bool, waited_s: float = 0.0) -> None:
        """``waited_s``: time the socket already waited for its first event (in a worker)."""
        hub = self.hub
        generation = hub.next_generation()
        timeout = self.first_event_timeout_s
        if timeout > 0:  # what is left of it, and never 0, which would mean "no timeout"
            timeout = max(timeout - waited_s, 1e-3)
        ref = await hub.system.spawn(
            ConnectionActor,
            socket,
            hub,
            generation,
            autostart,
            timeout,
            name=f"connection-{generation}",
            restart=Restart.TEMPORARY,
        )
        await self.connections.add(ref)
        try:
            await ref.wait_stopped()
        finally:
            self.connections.remove(ref)
        if socket.open:  # the actor crashed
            await socket.close(1011, "internal_error")


def hypercorn_config(
    bind: str, *, max_frame_bytes: int, graceful_timeout_s: float
) -> HypercornConfig:
    """hypercorn's settings for every process that serves the app (the server, each worker)."""
    hyper = HypercornConfig()
    hyper.bind = [bind]
    # up to 2x reaches the projection (event_too_large); beyond that, hypercorn closes 1009
    hyper.websocket_max_message_size = 2 * max_frame_bytes
    hyper.graceful_timeout = graceful_timeout_s
    hyper.accesslog = None
    hyper.errorlog = None
    return hyper


def build_app(
    backend: Backend,
    *,
    max_frame_bytes: int,
    realtime_vad: str | None = None,
) -> Starlette:
    """The routes, over ``backend``.

    ``realtime_vad`` backs ``server_vad`` in Realtime turn-based sessions
    (``server.realtime_vad``); ``None`` leaves it to the session defaults.
    """

    async def health(request: Request) -> Response:
        return (await backend.http("health")).response()

    async def models(request: Request) -> Response:
        return (await backend.http("models")).response()

    async def metrics(request: Request) -> Response:
        return (await backend.http("metrics")).response()

    async def duplex_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        projection = NativeProjection(max_size=max_frame_bytes)
        await backend.connect(WebSocketEvents(websocket, projection), autostart=False)

    async def realtime_socket(websocket: WebSocket) -> None:
        """OpenAI Realtime: the session opens on connect, as OpenAI's does.

        ``?duplex=1`` adds the duplex extensions; ``?resume=1`` waits for a
        ``session.resume`` instead of opening a session.
        """
        await websocket.accept()
        params = websocket.query_params
        try:
            duplex = duplex_flag(params.get("duplex"))
            resume_only = duplex_flag(params.get("resume"))
        except ProtocolError as exc:
            (text,) = NativeProjection().frames(ErrorEvent.from_exception(exc), None)
            await websocket.send_text(text)
            await websocket.close(1008, "bad_query")
            return
        projection = RealtimeProjection(
            schema=schema_from_headers(websocket.headers.get("openai-beta")),
            duplex=duplex,
            model=params.get("model"),
            max_size=max_frame_bytes,
            vad=realtime_vad,
        )
        await backend.connect(WebSocketEvents(websocket, projection), autostart=not resume_only)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            WebSocketRoute("/v1/duplex", duplex_socket),
            WebSocketRoute("/v1/realtime", realtime_socket),
        ]
    )
