"""The ASGI app: one Starlette app, one port, every route.

Routes are thin and ask a ``Backend`` for everything: ``HubBackend`` when the
sessions live in this process, a worker's link to the session process when
they do not (``_frontend.py``). HTTP handlers read runtime state; WebSocket
routes wrap the socket in its wire projection and hand it to the backend,
which runs its connection until it ends.

In front of every route sits ``Guard``, which applies the access policy
(``_access.py``: Host, Origin, failure limit, API key or client secret). A
refused HTTP request gets the policy's status and an OpenAI-style error body; a
refused WebSocket handshake gets the same status and body as its HTTP answer
(the ASGI denial response), so no socket is ever accepted and then closed for
access reasons. Client secrets live with the sessions (``HubBackend``), so
workers redeem them over their link.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, Literal, Protocol, final

import trio
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from duplex import __version__
from duplex.actors import ActorRef, ActorSystem, Restart
from duplex.exceptions import ProtocolError
from duplex.logs import get_logger
from duplex.metrics import Counter, Family, MetricsRegistry, Sample, merge_labelled, render
from duplex.progress import Startup
from duplex.refusals import JSON_CONTENT_TYPE, Refusal
from duplex.runtime import SessionHub
from duplex.sessions import ErrorEvent, RefusalLog
from duplex.wire import (
    ChatQuery,
    MoshiProjection,
    NativeProjection,
    PcmProjection,
    RealtimeProjection,
    duplex_flag,
    moshi_error_frame,
    schema_from_headers,
)

from ._access import (
    TOO_MANY_CONNECTIONS,
    AccessPolicy,
    AccessSettings,
    Allowed,
    ClientSecrets,
    PeerConnections,
    ResumeGuard,
    SecretStoreFull,
    client_secret_request,
    select_subprotocol,
)
from ._connection import ConnectionActor, ShutDown
from ._http import PathLimitedConfig
from ._latency import LatencyMetrics
from ._limits import BodyDeadline, deny
from ._sockets import EventSocket, WebSocketEvents
from ._stream_socket import FramedSocket
from ._wait_queue import WaitQueue

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}

HttpRoute = Literal["health", "models", "metrics", "client_secrets", "redeem"]
"""``client_secrets``: mint one (body: ``{"ttl_s", "session"}``); ``redeem``: use one up
(body: the secret; 200 or 401). Both are answered where the secret store is."""

MAX_CLIENT_SECRET_BODY = 64 * 1024
"""Largest ``POST /v1/realtime/client_secrets`` body read (a session config is small)."""

WEB_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
"""The browser client's files (``clients/web``, shipped as ``duplex/web``), by extension."""
WEB_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; media-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'",
}
WEB_PATHS = frozenset({"/", "/index.html"})
"""Paths besides ``/web/*`` that answer with the browser client."""


def web_files() -> dict[str, bytes]:
    """The browser client's files by name, read once: only these names are ever served."""
    folder = resources.files("duplex") / "web"
    if not folder.is_dir():
        return {}
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if entry.is_file() and any(entry.name.endswith(ext) for ext in WEB_TYPES)
    }


def is_web_path(path: str) -> bool:
    """The page and its assets: public (no key; Host and Origin still checked), since a
    browser cannot send a key when it loads a page; the key goes with the WebSocket."""
    return path in WEB_PATHS or path.startswith("/web/")


wall_time: Callable[[], float] = time.time
"""The clock of client-secret expiry (a Unix time the client is told); tests replace it."""


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """One HTTP answer, as plain data (it crosses a worker's link)."""

    status: int
    media_type: str
    body: bytes

    @classmethod
    def json(cls, content: Any, status: int = 200) -> HttpAnswer:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return cls(status, JSON_CONTENT_TYPE, text.encode())

    @classmethod
    def refused(cls, refusal: Refusal) -> HttpAnswer:
        """A refusal as an answer that crosses a link (its extra headers stay behind: the
        routes that answer over a link refuse with none)."""
        return cls(refusal.status, JSON_CONTENT_TYPE, refusal.body_bytes())

    def response(self) -> Response:
        return Response(self.body, status_code=self.status, media_type=self.media_type)


def refusal_response(refusal: Refusal) -> Response:
    """A refusal as Starlette's response, with every header it needs."""
    response = Response(refusal.body_bytes(), status_code=refusal.status)
    for name, value in refusal.http_headers():
        response.headers[name] = value
    return response


async def refuse_upgrade(websocket: WebSocket, refusal: Refusal) -> None:
    """Refuse a WebSocket handshake with ``refusal`` as its HTTP answer (status and body:
    the client reads why), or, where the server cannot answer a handshake over HTTP, with
    a close before accepting (a 403 with no body)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(refusal_response(refusal))
    else:
        await websocket.close(refusal.close_code)


class Backend(Protocol):
    """What the routes need from the process that owns the sessions."""

    async def http(self, route: HttpRoute, body: bytes = b"") -> HttpAnswer:
        """The answer to one of the HTTP routes (``body``: what the route needs of the request)."""
        ...

    async def connect(
        self,
        socket: EventSocket,
        *,
        autostart: bool,
        peer: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        """Run one client socket's connection until it ends; ``peer``: its IP address;
        ``endpoint``: the route's path, for logs."""
        ...


def _shut_down(ref: ActorRef[Any]) -> None:
    """Tell a connection the server stops; a full control lane leaves it to the abort."""
    with contextlib.suppress(trio.WouldBlock):
        ref.tell_nowait(ShutDown())


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
            _shut_down(ref)
        if self.live:
            with trio.move_on_after(within_s):
                await self._none_left.wait()

    async def add(self, ref: ActorRef[Any]) -> None:
        self.live.add(ref)
        if self.closing:  # accepted just as the shutdown began
            _shut_down(ref)

    def remove(self, ref: ActorRef[Any]) -> None:
        self.live.discard(ref)
        if self.closing and not self.live:
            self._none_left.set()


class Shards(Protocol):
    """The server's other session shards, as its HTTP routes see them: they answer for the
    whole server, given this process's own part (``topology/_shards.py``)."""

    async def health(self, own: dict[str, Any]) -> dict[str, Any]:
        """The server's ``/health`` body from this process's own (``status``: ``starting``
        while this process starts)."""
        ...

    async def metrics(self, own: list[Family], own_health: dict[str, Any]) -> list[Family]:
        """The server's ``/metrics`` families from this process's own."""
        ...


class Workers(Protocol):
    """The server's connection workers, as its ``/metrics`` sees them: each keeps its HTTP
    boundary's figures in its own process (``topology/_workers.py``)."""

    async def metrics(self) -> list[tuple[dict[str, str], list[Family]]]:
        """Each serving worker's families, with the labels that tell it apart."""
        ...

    def starting(self) -> str | None:
        """What the workers' start still waits for (``None``: every one has served)."""
        ...


WAITING_ENDPOINTS: Final = frozenset({"/api/chat"})
"""Routes whose sockets may wait for a slot (``server.chat_wait_queue``): the Moshi
clients show "waiting" until the handshake; JSON clients expect an answer at once."""


_WAIT_QUEUE_METRICS: Final = (
    ("duplex_chat_queue_waiting", "gauge", "/api/chat sockets waiting for a slot", "waiting"),
    (
        "duplex_chat_queue_admitted_total",
        "counter",
        "/api/chat sockets that waited for a slot and got one",
        "admitted",
    ),
    (
        "duplex_chat_queue_refused_total",
        "counter",
        "/api/chat sockets refused (1013) because the wait queue was full",
        "refused",
    ),
    (
        "duplex_chat_queue_left_total",
        "counter",
        "/api/chat sockets that left the wait queue before they got a slot",
        "left",
    ),
)
"""The wait queue's figures (`WaitQueueStatistics` fields), exported when it is on."""


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
        resume_guard: ResumeGuard | None = None,
        startup: Startup | None = None,
        chat_wait_queue: int = 0,
        more_models: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        """``first_event_timeout_s`` closes sockets that open no session in time (0: never);
        ``resume_guard`` limits failed ``session.resume`` per peer and session id;
        ``startup``: what the engine and VAD still wait for (``/health`` names it);
        ``chat_wait_queue``: ``/api/chat`` sockets that may wait for a slot when the
        server is full (0: refused at once); ``more_models``: the cards of the other models
        this process serves (``GET /v1/models``)."""
        self.hub = hub
        self.startup = startup
        self.ready = trio.Event()
        """Set by whoever starts the engine and the VAD, once both run."""
        self.registry = registry
        self.connections = Connections(hub.system)
        self.first_event_timeout_s = first_event_timeout_s
        self.resume_guard = resume_guard
        self.secrets = ClientSecrets()
        self.latency = LatencyMetrics(registry, hub.spec.name)
        if resume_guard is not None:
            limiter = resume_guard.limiter
            name = "duplex_resume_rate_limited_total"
            registry.add_collector(
                name,
                "counter",
                "session.resume refused rate_limited (too many failures by its peer or id)",
                lambda: [Sample(name, {}, float(limiter.statistics().refused))],
            )

        self.wait_queue = WaitQueue(chat_wait_queue) if chat_wait_queue > 0 else None
        if self.wait_queue is not None:
            self._export_wait_queue(self.wait_queue)
        self.shards: Shards | None = None
        """The other session shards, once they run (`attach_shards`)."""
        self.workers: Workers | None = None
        """The connection workers, once they run (`attach_workers`)."""
        self.more_models: Callable[[], list[dict[str, Any]]] = more_models or list
        """The cards of the other models this process serves (the request engines', the
        agent's), listed by ``GET /v1/models`` after the realtime model's."""

    def _export_wait_queue(self, queue: WaitQueue) -> None:
        for name, kind, help_text, field in _WAIT_QUEUE_METRICS:

            def collect(name: str = name, field: str = field) -> list[Sample]:
                return [Sample(name, {}, float(getattr(queue.statistics(), field)))]

            self.registry.add_collector(name, kind, help_text, collect)

    def attach_shards(self, shards: Shards) -> None:
        """The server's other session shards run: ``/health`` and ``/metrics`` answer for
        them all from now on."""
        self.shards = shards

    def attach_workers(self, workers: Workers) -> None:
        """Connection workers serve this process's sockets: ``/metrics`` merges theirs."""
        self.workers = workers

    def health_of(self) -> dict[str, Any]:
        """This process's own health."""
        hub = self.hub
        stats = hub.admission.statistics()
        waiting = self.startup.waiting_for() if self.startup is not None else {}
        if not hub.ready and not waiting:
            waiting = {"engine": "not running"}
        # the first worker answers while the others still start: clients let in then would
        # all land on it (a socket stays with the worker that accepted it)
        workers = self.workers.starting() if self.workers is not None else None
        if workers is not None:
            waiting = {**waiting, "connection_workers": workers}
        engines = hub.engine_health()
        if hub.sleeping:  # stopped on purpose (POST /v1/omni/sleep), not starting
            waiting = {}
        status = "ok" if not waiting else "starting"
        if status == "ok" and any(engine["status"] != "ok" for engine in engines):
            status = "degraded"  # an engine is stalled or gone: the others still admit
        if hub.sleeping:
            status = "sleeping"
        health: dict[str, Any] = {"status": status, "engines": engines}
        if waiting:
            health["waiting_for"] = waiting
        return {
            **health,
            "engine_starts": hub.engine_starts,
            "vad_starts": hub.vad_starts,
            "version": __version__,
            "model": hub.spec.name,
            "sessions": {"live": stats.live, "capacity": hub.capacity()},
        }

    def reply(self, route: HttpRoute, body: bytes = b"") -> HttpAnswer:
        """The answer for this process alone."""
        hub = self.hub
        if route == "client_secrets":
            return self.mint(body)
        if route == "redeem":
            redeemed = self.secrets.redeem(body.decode("utf-8", "replace"), wall_time())
            return HttpAnswer(200 if redeemed else 401, JSON_CONTENT_TYPE, b"{}")
        if route == "health":
            health = self.health_of()
            return HttpAnswer.json(health, 503 if health["status"] == "starting" else 200)
        if route == "models":
            card: dict[str, Any] = {
                "id": hub.spec.name,
                "object": "model",
                "owned_by": "duplex",
                "created": 0,
                "kind": "realtime",
                "capabilities": hub.capabilities.as_dict(),
            }
            return HttpAnswer.json({"object": "list", "data": [card, *self.more_models()]})
        return HttpAnswer(200, PROMETHEUS_CONTENT_TYPE, self.registry.render().encode())

    def mint(self, body: bytes) -> HttpAnswer:
        """A client secret for the request ``body`` (``{"ttl_s", "session"}``, checked)."""
        request = json.loads(body)
        try:
            minted = self.secrets.mint(wall_time(), request["ttl_s"])
        except SecretStoreFull:
            return HttpAnswer.refused(Refusal(429, "Too many live client secrets.", "rate_limited"))
        answer = {"value": minted.value, "expires_at": int(minted.expires_at)}
        return HttpAnswer.json({**answer, "session": request["session"]})

    async def http(self, route: HttpRoute, body: bytes = b"") -> HttpAnswer:
        if route == "metrics" and (self.shards is not None or self.workers is not None):
            families = self.registry.families()
            if self.shards is not None:
                families = await self.shards.metrics(families, self.health_of())
            if self.workers is not None:
                families = merge_labelled([({}, families), *await self.workers.metrics()])
            return HttpAnswer(200, PROMETHEUS_CONTENT_TYPE, render(families).encode())
        if self.shards is None or route != "health":
            return self.reply(route, body)
        health = await self.shards.health(self.health_of())
        return HttpAnswer.json(health, 503 if health["status"] == "starting" else 200)

    async def connect(
        self,
        socket: EventSocket,
        *,
        autostart: bool,
        peer: str | None = None,
        waited_s: float = 0.0,
        endpoint: str | None = None,
    ) -> None:
        """``waited_s``: time the socket already waited for its first event (in a worker);
        ``endpoint``: the route's path, for logs."""
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
            self.resume_guard,
            peer,
            endpoint,
            self.latency.connection(endpoint),
            self.wait_queue if endpoint in WAITING_ENDPOINTS else None,
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
    bind: str,
    *,
    max_frame_bytes: int,
    graceful_timeout_s: float,
    tls_certfile: str = "",
    tls_keyfile: str = "",
    message_limits: Mapping[str, int] | None = None,
) -> HypercornConfig:
    """hypercorn's settings for every process that serves the app (the server, each worker).

    With ``tls_certfile`` and ``tls_keyfile`` the port speaks TLS only (HTTPS, WSS).
    ``message_limits``: routes with a frame limit of their own (the robot endpoint's, when it
    is served), by path; up to twice it reaches that route (which refuses what is over it).
    """
    hyper = PathLimitedConfig()
    hyper.bind = [bind]
    if tls_certfile:
        hyper.certfile = tls_certfile
        hyper.keyfile = tls_keyfile
    # up to 2x reaches the projection (event_too_large); beyond that, hypercorn closes 1009
    hyper.websocket_max_message_size = 2 * max_frame_bytes
    for path, limit in (message_limits or {}).items():
        hyper.websocket_message_limits[path] = 2 * limit
    hyper.graceful_timeout = graceful_timeout_s
    hyper.accesslog = None
    hyper.errorlog = None
    return hyper


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    """Lowercase names; a repeated header's values joined by commas (a repeated ``Host``
    then parses as no host at all)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


_PATH_LOGGED = 200
"""Characters of a refused request's path a log line keeps (the client chose it)."""


class Guard:
    """Pure ASGI middleware: the access policy on every HTTP request and WebSocket handshake."""

    def __init__(
        self, app: Any, policy: AccessPolicy, backend: Backend, refused: Counter | None
    ) -> None:
        self.app = app
        self.policy = policy
        self.backend = backend
        self.refused = refused
        self.peers = PeerConnections(policy.settings.max_connections_per_peer)
        self.refusal_log = RefusalLog()
        self.log = get_logger(component="access")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client, server = scope.get("client"), scope.get("server")
        peer = client[0] if client else None
        now = trio.current_time()
        decision = self.policy.decide(
            kind,
            _headers(scope),
            peer=peer,
            bound_port=server[1] if server else None,
            now=now,
            public=kind == "http" and is_web_path(str(scope.get("path", ""))),
            secure=scope.get("scheme") in ("https", "wss"),
        )
        if isinstance(decision, Allowed) and decision.secret is not None:
            redeemed = await self.backend.http("redeem", decision.secret.encode())
            if redeemed.status != 200:
                decision = self.policy.secret_refused(peer, now)
        # WebSockets and HTTP requests in flight both hold a socket and tasks: one cap
        if isinstance(decision, Allowed) and not self.peers.enter(peer):
            decision = TOO_MANY_CONNECTIONS
        if isinstance(decision, Refusal):
            if self.refused is not None:
                self.refused.inc(code=decision.code)
            unlogged = self.refusal_log.note(decision.code, now)
            if unlogged is not None:  # never a credential: the code says which check failed
                self.log.warning(
                    "access refused",
                    kind=kind,
                    path=str(scope.get("path", ""))[:_PATH_LOGGED],
                    peer=peer,
                    status=decision.status,
                    code=decision.code,
                    unlogged_since_last=unlogged,
                )
            await deny(scope, receive, send, decision)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.peers.leave(peer)


async def _http_refused(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a method the route does not take), in
    the error shape of every other answer."""
    assert isinstance(exc, HTTPException)
    refusal = Refusal(
        exc.status_code,
        f"{request.method} {request.url.path[:_PATH_LOGGED]}: {exc.detail}",
        HTTP_ERROR_CODES.get(exc.status_code, "invalid_request"),
        headers=tuple((exc.headers or {}).items()),
    )
    return refusal_response(refusal)


async def _http_failed(request: Request, exc: Exception) -> Response:
    """A route that raised: logged with its traceback, answered 500 in the error shape."""
    get_logger(component="http").error(
        "request failed", method=request.method, path=request.url.path, exc_info=exc
    )
    return refusal_response(Refusal(500, "internal error", "internal_error"))


_CLIENT_LEFT_LOG = RefusalLog()


async def _client_left(request: Request, exc: Exception) -> Response:
    """A client that left mid-body (or whose body missed its deadline): one throttled line,
    not a traceback (100 aborts logged 253 KB of them); nobody reads the answer."""
    unlogged = _CLIENT_LEFT_LOG.note("client_left", time.monotonic())
    if unlogged is not None:
        get_logger(component="http").info(
            "client left mid-request", method=request.method,
            path=request.url.path[:_PATH_LOGGED], unlogged_since_last=unlogged,
        )  # fmt: skip
    return Response(status_code=499)


EXCEPTION_HANDLERS: Final[dict[Any, Any]] = {
    HTTPException: _http_refused,
    ClientDisconnect: _client_left,
    Exception: _http_failed,
}


def routes_app(routes: Sequence[BaseRoute]) -> Starlette:
    """``routes`` alone, in the error shape of every answer: the service routes that run
    where their engines are, as a server process runs them for its connection workers,
    which relay them whole (``topology/_relay.py``)."""
    return Starlette(exception_handlers=EXCEPTION_HANDLERS, routes=list(routes))


def relayed(routes: Sequence[BaseRoute], relay: Any) -> list[BaseRoute]:
    """``routes``' paths and methods, each answered by the ASGI app ``relay``."""
    relayed: list[BaseRoute] = []
    for route in routes:
        if isinstance(route, WebSocketRoute):
            relayed.append(WebSocketRoute(route.path, relay))
        else:
            assert isinstance(route, Route)
            relayed.append(Route(route.path, relay, methods=route.methods))
    return relayed


def _body_timeouts(registry: MetricsRegistry | None) -> Callable[[Any, int, float], None]:
    """What a body cut short by its deadline leaves: a count and a throttled line."""
    counter = None
    if registry is not None:
        counter = registry.counter(
            "duplex_http_body_timeouts_total",
            "HTTP request bodies that did not arrive in time (answered 408)",
        )
    rate = RefusalLog()
    log = get_logger(component="http")

    def on_timeout(scope: Any, received: int, took_s: float) -> None:
        if counter is not None:
            counter.inc()
        unlogged = rate.note("body_timeout", trio.current_time())
        if unlogged is not None:
            client = scope.get("client")
            log.warning(
                "request body timed out", path=str(scope.get("path", ""))[:_PATH_LOGGED],
                peer=client[0] if client else None, received_bytes=received,
                took_s=round(took_s, 2), unlogged_since_last=unlogged,
            )  # fmt: skip

    return on_timeout


@final
class SessionRoutes:
    """The handlers of the routes every server has (the sessions' sockets, health, models,
    metrics, client secrets, the browser client), over one `Backend`; ``build_app`` adds the
    service routes beside them. Arguments as ``build_app``'s."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_frame_bytes: int,
        realtime_vad: str | None,
        realtime_agent: bool,
        client_secret_ttl_s: int,
    ) -> None:
        self.backend = backend
        self.max_frame_bytes = max_frame_bytes
        self.realtime_vad = realtime_vad
        self.realtime_agent = realtime_agent
        self.client_secret_ttl_s = client_secret_ttl_s
        self.files = web_files()
        self.bad_queries = RefusalLog()  # a log line for the first, then one every 10 s

    async def health(self, request: Request) -> Response:
        return (await self.backend.http("health")).response()

    async def models(self, request: Request) -> Response:
        return (await self.backend.http("models")).response()

    async def metrics(self, request: Request) -> Response:
        return (await self.backend.http("metrics")).response()

    async def client_secrets(self, request: Request) -> Response:
        """OpenAI's ``POST /v1/realtime/client_secrets``: a short-lived single-use key."""
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_CLIENT_SECRET_BODY:
                return refusal_response(Refusal(413, "The body is too large.", "body_too_large"))
        parsed = client_secret_request(body, self.client_secret_ttl_s)
        if isinstance(parsed, Refusal):
            return refusal_response(parsed)
        ttl_s, session = parsed
        body = json.dumps({"ttl_s": ttl_s, "session": session}).encode()
        return (await self.backend.http("client_secrets", body)).response()

    async def web(self, request: Request) -> Response:
        """The browser client (``clients/web``): ``/`` is its page, ``/web/<name>`` its files."""
        path = request.url.path
        name = "index.html" if path in WEB_PATHS else path.removeprefix("/web/")
        body = self.files.get(name)
        if body is None:
            return refusal_response(Refusal(404, f"no such file: {path[:200]}", "not_found"))
        media_type = WEB_TYPES[name[name.rindex(".") :]]
        return Response(body, media_type=media_type, headers=WEB_HEADERS)

    async def upgrade_required(self, request: Request) -> Response:
        """A plain HTTP request on a WebSocket route: 426, naming the upgrade it needs."""
        message = f"{request.url.path} is a WebSocket endpoint: send an Upgrade: websocket request"
        upgrade = (("Upgrade", "websocket"), ("Connection", "Upgrade"))
        return refusal_response(Refusal(426, message, "upgrade_required", headers=upgrade))

    async def _accept(self, websocket: WebSocket) -> str | None:
        """Accept, echoing ``realtime`` when a browser offered it; returns the peer address."""
        await websocket.accept(subprotocol=select_subprotocol(websocket.scope["subprotocols"]))
        return websocket.client.host if websocket.client else None

    async def duplex_socket(self, websocket: WebSocket) -> None:
        peer = await self._accept(websocket)
        projection = NativeProjection(max_size=self.max_frame_bytes)
        events = WebSocketEvents(websocket, projection)
        await self.backend.connect(events, autostart=False, peer=peer, endpoint="/v1/duplex")

    def _refuse_query(self, endpoint: str, peer: str | None, exc: ProtocolError) -> None:
        unlogged = self.bad_queries.note("bad_query", trio.current_time())
        if unlogged is not None:
            get_logger(component="http").warning(
                "connection refused",
                endpoint=endpoint,
                peer=peer,
                code=1008,
                reason="bad_query",
                param=exc.param,
                unlogged_since_last=unlogged,
            )

    async def realtime_socket(self, websocket: WebSocket) -> None:
        """OpenAI Realtime: the session opens on connect, as OpenAI's does.

        ``?duplex=1`` adds the duplex extensions; ``?resume=1`` waits for a
        ``session.resume`` instead of opening a session.
        """
        peer = await self._accept(websocket)
        params = websocket.query_params
        try:
            duplex = duplex_flag(params.get("duplex"))
            resume_only = duplex_flag(params.get("resume"))
        except ProtocolError as exc:
            self._refuse_query("/v1/realtime", peer, exc)
            (text,) = NativeProjection().frames(ErrorEvent.from_exception(exc), None)
            await websocket.send_text(text)
            await websocket.close(1008, "bad_query")
            return
        projection = RealtimeProjection(
            schema=schema_from_headers(websocket.headers.get("openai-beta")),
            duplex=duplex,
            model=params.get("model"),
            max_size=self.max_frame_bytes,
            vad=self.realtime_vad,
            agent=self.realtime_agent,
        )
        events = WebSocketEvents(websocket, projection)
        await self.backend.connect(
            events, autostart=not resume_only, peer=peer, endpoint="/v1/realtime"
        )

    async def _serve_stream(
        self, socket: FramedSocket, *, autostart: bool, peer: str | None, endpoint: str
    ) -> None:
        """Run the connection, with the task that keeps its output stream flowing."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(socket.keep_flowing)
            await self.backend.connect(socket, autostart=autostart, peer=peer, endpoint=endpoint)
            nursery.cancel_scope.cancel()

    async def chat_socket(self, websocket: WebSocket) -> None:
        """Moshi's and PersonaPlex's ``/api/chat``: the session opens on connect with the
        query's prompt; ``0x00`` goes out when its slot takes input."""
        peer = await self._accept(websocket)
        try:
            query = ChatQuery.parse(websocket.query_params)
        except ProtocolError as exc:
            self._refuse_query("/api/chat", peer, exc)
            await websocket.send_bytes(moshi_error_frame(ErrorEvent.from_exception(exc)))
            await websocket.close(1008, "bad_query")
            return
        socket = FramedSocket(websocket, MoshiProjection(query, max_size=self.max_frame_bytes))
        await self._serve_stream(socket, autostart=True, peer=peer, endpoint="/api/chat")

    async def pcm_socket(self, websocket: WebSocket) -> None:
        """vllm-omni's raw ``/v1/audio/duplex``: JSON ``open``/``close``, float32 PCM."""
        peer = await self._accept(websocket)
        socket = FramedSocket(websocket, PcmProjection(max_size=self.max_frame_bytes))
        await self._serve_stream(socket, autostart=False, peer=peer, endpoint="/v1/audio/duplex")

    async def healthz(self, request: Request) -> Response:
        """OpenPI's ``GET /healthz``: 200 ``OK`` while the server runs."""
        return PlainTextResponse("OK\n")

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.web),
            Route("/index.html", self.web),
            Route("/web/{name:path}", self.web),
            Route("/health", self.health),
            Route("/healthz", self.healthz),
            Route("/v1/models", self.models),
            Route("/metrics", self.metrics),
            Route("/v1/realtime/client_secrets", self.client_secrets, methods=["POST"]),
            WebSocketRoute("/v1/duplex", self.duplex_socket),
            WebSocketRoute("/v1/realtime", self.realtime_socket),
            WebSocketRoute("/api/chat", self.chat_socket),
            WebSocketRoute("/v1/audio/duplex", self.pcm_socket),
        ]


def build_app(
    backend: Backend,
    *,
    max_frame_bytes: int,
    realtime_vad: str | None = None,
    realtime_agent: bool = False,
    access: AccessSettings | None = None,
    client_secret_ttl_s: int = 600,
    registry: MetricsRegistry | None = None,
    routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The routes, over ``backend``, behind ``Guard``.

    ``realtime_vad`` backs ``server_vad`` in Realtime turn-based sessions
    (``server.realtime_vad``); ``None`` leaves it to the session defaults.
    ``realtime_agent``: the voice agent answers, so ``?duplex=1`` Realtime sessions open
    turn-based too (the agent's replies follow their overlap policy; ``server.agent``).
    ``access``: who may connect (``None``: anyone on loopback, same-origin browsers).
    ``client_secret_ttl_s``: a client secret's lifetime when its request names none.
    ``registry``: where refusals are counted (``None``: not counted).
    ``routes``: the service routes (speech, images, videos, robots: ``duplex.services``), as
    the topology builds them: served here, or in a connection worker relayed whole to the
    process that runs them (`relayed`). A plain HTTP request on any WebSocket route, the
    sessions' and these, is answered 426.
    """
    policy = AccessPolicy(access or AccessSettings())
    refused = None
    if registry is not None:
        refused = registry.counter(
            "duplex_access_refused_total",
            "HTTP requests and WebSocket handshakes refused by the access policy, and "
            "WebSocket handshakes no route takes (code not_found)",
            ["code"],
        )

    session_routes = SessionRoutes(
        backend,
        max_frame_bytes=max_frame_bytes,
        realtime_vad=realtime_vad,
        realtime_agent=realtime_agent,
        client_secret_ttl_s=client_secret_ttl_s,
    )
    all_routes: list[BaseRoute] = [*session_routes.routes(), *routes]
    http_paths = {route.path for route in all_routes if isinstance(route, Route)}
    all_routes += [  # a plain GET on a WebSocket route: 426, not 404
        Route(route.path, session_routes.upgrade_required)
        for route in all_routes
        if isinstance(route, WebSocketRoute) and route.path not in http_paths
    ]
    app = Starlette(exception_handlers=EXCEPTION_HANDLERS, routes=all_routes)
    app.router.default = _NoWebSocketRoute(app.router.not_found, all_routes, refused)
    app.add_middleware(
        BodyDeadline, timeout_s=policy.settings.body_timeout_s, on_timeout=_body_timeouts(registry)
    )
    app.add_middleware(Guard, policy=policy, backend=backend, refused=refused)
    return app


class _NoWebSocketRoute:
    """The answer to a WebSocket upgrade no route takes: 404 with a body that names the
    WebSocket routes there are, and a log line (Starlette's own is a 403 with no body, and
    nothing logged). HTTP requests keep Starlette's 404 (``_http_refused``)."""

    def __init__(
        self, http_not_found: Any, routes: Sequence[BaseRoute], refused: Counter | None
    ) -> None:
        self.http_not_found = http_not_found
        self.paths = sorted(r.path for r in routes if isinstance(r, WebSocketRoute))
        self.refused = refused
        self.log_rate = RefusalLog()
        self.log = get_logger(component="http")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.http_not_found(scope, receive, send)
            return
        path = str(scope.get("path", ""))[:_PATH_LOGGED]
        refusal = Refusal(
            404,
            f"no WebSocket endpoint at {path}; the WebSocket endpoints are "
            + ", ".join(self.paths),
            "not_found",
        )
        if self.refused is not None:
            self.refused.inc(code=refusal.code)
        unlogged = self.log_rate.note("not_found", trio.current_time())
        if unlogged is not None:
            client = scope.get("client")
            self.log.warning(
                "websocket refused",
                path=path,
                peer=client[0] if client else None,
                status=404,
                code=refusal.code,
                unlogged_since_last=unlogged,
            )
        await deny(scope, receive, send, refusal)
