"""The ASGI app: one Starlette app, one port, every route.

Routes are thin: HTTP handlers read runtime state, the WebSocket route hands
the socket to a connection actor and waits for it to end.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState

from duplex import __version__
from duplex.actors import ActorRef, ActorSystem, Restart
from duplex.exceptions import ProtocolError
from duplex.metrics import MetricsRegistry
from duplex.sessions import ErrorEvent
from duplex.sessions._hub import SessionHub

from ._connection import ConnectionActor, Projection
from ._duplex_wire import NativeProjection
from ._realtime_wire import RealtimeProjection, duplex_flag, schema_from_headers

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Connections:
    """The live connection actors, so a shutdown can close every socket first (1001)."""

    def __init__(self, system: ActorSystem) -> None:
        self.system = system
        self.live: set[ActorRef[Any]] = set()
        self.closing = False

    async def close_all(self) -> None:
        """Close every socket, and from now on every socket that is still arriving."""
        self.closing = True
        for ref in list(self.live):
            await self.system.stop(ref)

    async def add(self, ref: ActorRef[Any]) -> None:
        self.live.add(ref)
        if self.closing:  # accepted just as the shutdown began
            await self.system.stop(ref)


def build_app(
    hub: SessionHub,
    connections: Connections,
    *,
    registry: MetricsRegistry,
    max_frame_bytes: int,
    realtime_vad: str | None = None,
    first_event_timeout_s: float = 0.0,
) -> Starlette:
    """The app for one running hub (engine + sessions).

    ``realtime_vad`` backs ``server_vad`` in Realtime turn-based sessions
    (``server.realtime_vad``); ``None`` leaves it to the session defaults.
    ``first_event_timeout_s`` closes sockets that open no session in time (0: never).
    """
    model = hub.spec

    async def health(request: Request) -> Response:
        stats = hub.admission.statistics()
        return JSONResponse(
            {
                "status": "ok" if hub.ready else "starting",
                "engine_starts": hub.engine_starts,
                "vad_starts": hub.vad_starts,
                "version": __version__,
                "model": model.name,
                "sessions": {"live": stats.live, "capacity": stats.capacity},
            },
            status_code=200 if hub.ready else 503,
        )

    async def models(request: Request) -> Response:
        card: dict[str, Any] = {
            "id": model.name,
            "object": "model",
            "owned_by": "duplex",
            "created": 0,
            "capabilities": hub.capabilities.as_dict(),
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(registry.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def run_connection(
        websocket: WebSocket, projection: Projection, *, autostart: bool
    ) -> None:
        generation = hub.next_generation()
        ref = await hub.system.spawn(
            ConnectionActor,
            websocket,
            hub,
            generation,
            projection,
            autostart,
            first_event_timeout_s,
            name=f"connection-{generation}",
            restart=Restart.TEMPORARY,
        )
        await connections.add(ref)
        try:
            await ref.wait_stopped()
        finally:
            connections.live.discard(ref)
        if websocket.application_state is WebSocketState.CONNECTED:  # the actor crashed
            await websocket.close(1011, "internal_error")

    async def duplex_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_connection(websocket, NativeProjection(max_size=max_frame_bytes), autostart=False)

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
        await run_connection(websocket, projection, autostart=not resume_only)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            WebSocketRoute("/v1/duplex", duplex_socket),
            WebSocketRoute("/v1/realtime", realtime_socket),
        ]
    )
