"""The cluster's ingress: an ASGI app on hypercorn that sends each request to a node.

Stateless: it holds the controller's last table (refreshed every ``refresh_s``, one
Ray call) and the sockets it relays, nothing else, so any number of copies route
any request alike. A new session goes to the node with the most room
(``Placement.place``); a ``session.resume``, or a request naming a video, goes to
the node its id names. A WebSocket is relayed socket to socket (the ``websockets``
client to the node's server): frames never touch Ray. When a node's socket breaks
without a close (the node died), its client is told at once with a typed error
(``node_lost``) and a 1011 close; a full cluster refuses as one full server does.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, suppress
from functools import partial
from typing import Any, Final, Protocol, final

import httpx
import trio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.trio.client import ClientConnection, connect

from duplex.logs import get_logger
from duplex.metrics import Family, MetricsRegistry, Sample, render
from duplex.refusals import Refusal
from duplex.transport import has_body, hypercorn_config, refusal_response, serve_http

from ._placement import (
    Expired,
    Full,
    NodeReport,
    NodeState,
    Placed,
    Placement,
    node_object_id,
    object_id_on,
)

__all__ = ["Ingress", "NodeTable", "TableUnavailable", "serve_ingress"]

JSON_PATHS: Final = frozenset({"/v1/duplex", "/v1/realtime", "/v1/audio/speech/stream"})
"""Sockets that speak JSON events: a refusal or a lost node is told as an ``error`` event."""

CONNECT_TRIES = 3
"""Nodes tried for a new session when one does not answer (it died since the last table)."""

_VIDEO = re.compile(r"^/v1/videos/([^/]+)(/.*)?$")
_HOP_HEADERS: Final = frozenset(
    {"host", "connection", "transfer-encoding", "keep-alive", "upgrade", "te", "trailer"}
)
"""Headers of one hop, never passed on (a body's ``content-length`` is: it streams through)."""
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_S = 10.0
"""How much of a body the node did not read is still read (and dropped) after its answer."""
_PROMETHEUS: Final = "text/plain; version=0.0.4; charset=utf-8"


class NodeTable(Protocol):
    """Where the ingress reads the nodes (the controller, through Ray)."""

    async def nodes(self) -> list[NodeReport]:
        """Every node's last report."""
        ...


def _error(code: str, message: str, error_type: str) -> str:
    """An ``error`` event as one server sends it (native and Realtime alike)."""
    error = {"type": error_type, "code": code, "message": message, "param": None, "event_id": None}
    return json.dumps({"type": "error", "event_id": None, "error": error})


class TableUnavailable(Exception):
    """The node table could not be read (Ray's head unreachable): the last one is kept."""


def _resume_id(first: str | bytes) -> str | None:
    """The session id of a ``session.resume`` first event; ``None`` for anything else."""
    if not isinstance(first, str) or len(first) > 65536:
        return None
    try:
        event = json.loads(first)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("type") != "session.resume":
        return None
    session_id = event.get("session_id")
    return session_id if isinstance(session_id, str) else None


@final
class Ingress:
    """One ingress copy: ``run`` keeps its table fresh; ``app`` serves the routes."""

    def __init__(
        self,
        table: NodeTable,
        *,
        refresh_s: float = 0.25,
        first_event_timeout_s: float = 30.0,
        max_frame_bytes: int = 16 * 1024 * 1024,
        copies: int = 1,
    ) -> None:
        """``copies``: ingress copies running (each places within its share of a node's
        free slots between reports; ``Placement``)."""
        self.table = table
        self.refresh_s = refresh_s
        self.first_event_timeout_s = first_event_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.placement = Placement(salt=secrets.randbits(31) + 1, copies=copies)
        self.refreshed = trio.Event()
        """Set once the first table arrived (before it, every node is unknown)."""
        self.relays = 0
        self.node_lost = 0
        self.connect_failed = 0
        self.log = get_logger(component="ingress")
        # no pool limit: each relayed request holds its connection while its body streams,
        # and the connection cap of the ingress's own port bounds how many there are
        self._http = httpx.AsyncClient(timeout=60.0, limits=httpx.Limits(max_connections=None))
        self.registry = MetricsRegistry()
        """Its HTTP boundary's figures (`serve_http`'s), rendered with its own."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh the table forever (a failed refresh keeps the last one: logged)."""
        started = False
        while True:
            try:
                self.placement.update(await self.table.nodes())
                self.refreshed.set()
            except TableUnavailable as exc:
                self.log.warning("node table refresh failed", error=repr(exc))
            if not started:
                started = True
                task_status.started()
            await trio.sleep(self.refresh_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route(
                    "/{path:path}",
                    self.proxy,
                    methods=["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD"],
                ),
                WebSocketRoute("/{path:path}", self.relay),
            ]
        )

    # -- HTTP --------------------------------------------------------------------

    def sessions(self) -> dict[str, int]:
        """The cluster's live sessions and capacity: every node that takes sessions (each
        node's own capacity counts its engines once)."""
        serving = [n for n in self.placement.nodes() if n.state is NodeState.SERVING]
        draining = [n for n in self.placement.nodes() if n.state is NodeState.DRAINING]
        return {
            "live": sum(n.live for n in serving + draining),
            "capacity": sum(n.capacity for n in serving),
        }

    async def health(self, request: Request) -> Response:
        nodes = self.placement.nodes()
        serving = sum(n.state is NodeState.SERVING for n in nodes)
        body = {
            "status": "ok" if serving else "starting",
            "sessions": self.sessions(),
            "nodes": [
                {
                    "node": n.name,
                    "state": n.state.value,
                    "live": n.live,
                    "capacity": n.capacity,
                    "step_load": round(n.step_load, 3),
                    "refused": n.refused,
                }
                for n in nodes
            ],
        }
        return JSONResponse(body, status_code=200 if serving else 503)

    async def metrics(self, request: Request) -> Response:
        families = [*self.families(), *self.registry.families()]
        return Response(render(families), media_type=_PROMETHEUS)

    def families(self) -> list[Family]:
        """The cluster as this ingress sees it, and what it placed and refused."""
        nodes = self.placement.nodes()
        stats = self.placement.statistics()

        def family(name: str, kind: str, help_text: str, samples: list[Sample]) -> Family:
            return Family(name, kind, help_text, samples)

        def per_node(name: str, value: Callable[[NodeReport], float]) -> list[Sample]:
            return [Sample(name, {"node": n.name}, float(value(n))) for n in nodes]

        sessions = self.sessions()
        states = {state: 0 for state in NodeState}
        for node in nodes:
            states[node.state] += 1
        return [
            family(
                "duplex_cluster_nodes",
                "gauge",
                "Nodes known, by state",
                [
                    Sample("duplex_cluster_nodes", {"state": s.value}, float(n))
                    for s, n in states.items()
                ],
            ),
            family(
                "duplex_cluster_sessions_capacity",
                "gauge",
                "Sessions the serving nodes admit now (each engine counted once)",
                [Sample("duplex_cluster_sessions_capacity", {}, float(sessions["capacity"]))],
            ),
            family(
                "duplex_cluster_sessions_live",
                "gauge",
                "Sessions live on the nodes (serving and draining)",
                [Sample("duplex_cluster_sessions_live", {}, float(sessions["live"]))],
            ),
            family(
                "duplex_cluster_node_capacity_sessions",
                "gauge",
                "Each node's capacity as it last reported it",
                per_node("duplex_cluster_node_capacity_sessions", lambda n: n.capacity),
            ),
            family(
                "duplex_cluster_node_live_sessions",
                "gauge",
                "Each node's live sessions as it last reported them",
                per_node("duplex_cluster_node_live_sessions", lambda n: n.live),
            ),
            family(
                "duplex_cluster_node_step_load",
                "gauge",
                "Each node's engine step p99 over the 80 ms frame",
                per_node("duplex_cluster_node_step_load", lambda n: n.step_load),
            ),
            family(
                "duplex_cluster_node_refused_total",
                "counter",
                "Sessions each node's own admission refused (its duplex_sessions_refused_total)",
                per_node("duplex_cluster_node_refused_total", lambda n: n.refused),
            ),
            family(
                "duplex_cluster_placed_total",
                "counter",
                "New sessions this ingress sent to each node",
                [
                    Sample("duplex_cluster_placed_total", {"node": k}, float(v))
                    for k, v in sorted(stats.placed.items())
                ],
            ),
            family(
                "duplex_cluster_refused_total",
                "counter",
                "Requests refused by this ingress, by reason",
                [
                    Sample("duplex_cluster_refused_total", {"reason": "full"}, stats.refused_full),
                    Sample("duplex_cluster_refused_total", {"reason": "expired"}, stats.expired),
                ],
            ),
            family(
                "duplex_cluster_node_lost_total",
                "counter",
                "Relayed sockets whose node broke without a close (told node_lost, 1011)",
                [Sample("duplex_cluster_node_lost_total", {}, float(self.node_lost))],
            ),
            family(
                "duplex_cluster_connect_failed_total",
                "counter",
                "Nodes that did not answer a new socket (another node was tried)",
                [Sample("duplex_cluster_connect_failed_total", {}, float(self.connect_failed))],
            ),
            family(
                "duplex_cluster_relays",
                "gauge",
                "Sockets relayed now",
                [Sample("duplex_cluster_relays", {}, float(self.relays))],
            ),
        ]

    async def proxy(self, request: Request) -> Response:
        """Any other HTTP route: a request naming a video to its node, the rest to the
        node with the most room (not counted as a session)."""
        path = request.url.path
        found = _VIDEO.match(path)
        decision: Placed | Full | Expired
        if found:
            decision = self.placement.route(found.group(1))
            path = f"/v1/videos/{node_object_id(found.group(1))}{found.group(2) or ''}"
        else:
            decision = self.placement.place(count=False)
        if isinstance(decision, Full):
            full = Refusal(
                503,
                decision.reason,
                "resource_exhausted",
                error_type="rate_limit_error",
                retry_after_s=1.0,
            )
            return refusal_response(full)
        if isinstance(decision, Expired):
            return refusal_response(Refusal(404, decision.reason, "not_found"))
        # bodies stream through both ways, never held whole here (an upload, a video's
        # bytes): the node's own limits apply; only a JSON answer is read, to wrap its ids
        headers = _passed(request.headers)
        url = decision.url + path + (f"?{request.url.query}" if request.url.query else "")
        # a request without a body goes on without one (not as an empty chunked body)
        upload = _Upload(request) if has_body(request.scope) else None
        upstream = self._http.build_request(request.method, url, headers=headers, content=upload)
        try:
            reply = await self._http.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return _lost(decision.node, exc)
        except ClientDisconnect:  # the client left while its body was on its way
            return Response(status_code=499)  # nobody reads it; the node's request ended
        out = _passed(reply.headers, own=frozenset({"date", "server"}))
        if upload is not None and not upload.ended:  # the node answered before the body
            await upload.drain()  # ended (a 413, say): the rest is read first (the answer
            out["connection"] = "close"  # cannot pass a body the app no longer reads)
        if not reply.headers.get("content-type", "").startswith("application/json"):
            chunks = self._relayed(reply, decision.node)
            return StreamingResponse(chunks, status_code=reply.status_code, headers=out)
        try:
            body = await reply.aread()
        except httpx.HTTPError as exc:
            return _lost(decision.node, exc)
        finally:
            await reply.aclose()
        out.pop("content-length", None)  # the ids wrapped change it
        out.pop("content-encoding", None)  # httpx decoded it
        return Response(_wrap_ids(body, decision.node), reply.status_code, headers=out)

    async def _relayed(self, reply: httpx.Response, node: str) -> AsyncIterator[bytes]:
        """A node's answer as it arrives; a node that breaks it off ends it here (the client
        sees it cut short of its length), logged, and the reply is closed in every case."""
        try:
            async for chunk in reply.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            self.log.warning("node broke off an answer", node=node, error=repr(exc))
        finally:
            with trio.CancelScope(shield=True):
                await reply.aclose()

    # -- WebSocket ---------------------------------------------------------------

    async def relay(self, ws: WebSocket) -> None:
        """One client socket, relayed to its node's server until either end closes."""
        path, query = ws.url.path, ws.url.query
        json_wire = path in JSON_PATHS
        first: str | bytes | None = None
        holds_first = path == "/v1/duplex" or (path == "/v1/realtime" and "resume=1" in query)
        offered = list(ws.scope.get("subprotocols") or [])
        if holds_first:  # the first event says where it goes: a resume names its node
            await ws.accept(subprotocol=_plain(offered))
            first = await self._first(ws)
            if first is None:
                return
        session_id = _resume_id(first) if first is not None else None
        async with AsyncExitStack() as stack:
            upstream = await self._open(stack, ws, path, query, offered, session_id, json_wire)
            if upstream is None:
                return
            node, connection = upstream
            if ws.application_state is WebSocketState.CONNECTING:
                await ws.accept(subprotocol=connection.subprotocol)
            if first is not None:
                await connection.send(first)
            self.relays += 1
            try:
                await self._pump(ws, connection, node, json_wire)
            finally:
                self.relays -= 1

    async def _first(self, ws: WebSocket) -> str | bytes | None:
        with trio.move_on_after(self.first_event_timeout_s):
            try:
                message = await ws.receive()
            except WebSocketDisconnect:
                return None
            if message["type"] == "websocket.disconnect":
                return None
            text = message.get("text")
            return text if text is not None else message.get("bytes", b"")
        await _refuse(
            ws, True, "first_event_timeout", "no event in time", "invalid_request_error", 1008
        )
        return None

    async def _open(
        self,
        stack: AsyncExitStack,
        ws: WebSocket,
        path: str,
        query: str,
        offered: list[str],
        session_id: str | None,
        json_wire: bool,
    ) -> tuple[str, ClientConnection] | None:
        """The node's socket for this client (tried on other nodes for a new session); a
        refusal told to the client and ``None`` when there is none."""
        headers = {k: v for k, v in ws.headers.items() if k.lower() == "authorization"}
        failed: set[str] = set()
        for _ in range(CONNECT_TRIES):
            if session_id is not None:
                decision: Placed | Full | Expired = self.placement.route(session_id)
            else:
                decision = self.placement.place(exclude=frozenset(failed))
            if isinstance(decision, Full):
                await _refuse(
                    ws, json_wire, "resource_exhausted", decision.reason, "rate_limit_error", 1013
                )
                return None
            if isinstance(decision, Expired):
                message = f"unknown or expired duplex session: {session_id} ({decision.reason})"
                await _refuse(
                    ws, json_wire, "session_resume_expired", message, "invalid_request_error", 1008
                )
                return None
            url = "ws" + decision.url.removeprefix("http") + path + (f"?{query}" if query else "")
            try:
                connection = await stack.enter_async_context(
                    connect(
                        url,
                        subprotocols=offered or None,  # type: ignore[arg-type]
                        additional_headers=headers,
                        max_size=self.max_frame_bytes,
                        compression=None,
                        open_timeout=5,
                    )
                )
            except InvalidStatus as exc:  # the node refused the handshake: say why
                status = exc.response.status_code
                await _refuse(
                    ws,
                    json_wire,
                    "refused_by_node",
                    f"node answered {status}",
                    "invalid_request_error",
                    1008,
                )
                return None
            except (OSError, InvalidHandshake, TimeoutError, trio.TooSlowError) as exc:
                self.connect_failed += 1
                failed.add(decision.node)
                self.log.warning("node did not answer", node=decision.node, error=repr(exc))
                if session_id is not None:  # its node is gone: the session with it
                    message = f"unknown or expired duplex session: {session_id} (its node is gone)"
                    await _refuse(
                        ws,
                        json_wire,
                        "session_resume_expired",
                        message,
                        "invalid_request_error",
                        1008,
                    )
                    return None
                continue
            return decision.node, connection
        await _refuse(
            ws, json_wire, "resource_exhausted", "no node answered", "rate_limit_error", 1013
        )
        return None

    async def _pump(
        self, ws: WebSocket, node_ws: ClientConnection, node: str, json_wire: bool
    ) -> None:
        async with trio.open_nursery() as nursery:

            async def client_to_node() -> None:
                while True:
                    try:
                        message = await ws.receive()
                    except (WebSocketDisconnect, RuntimeError):
                        message = {"type": "websocket.disconnect", "code": 1006}
                    if message["type"] == "websocket.disconnect":
                        code = int(message.get("code") or 1000)
                        await node_ws.aclose(code if 1000 <= code < 1004 or code >= 3000 else 1001)
                        nursery.cancel_scope.cancel()
                        return
                    text = message.get("text")
                    try:
                        await node_ws.send(text if text is not None else message.get("bytes", b""))
                    except ConnectionClosed:
                        return  # the other direction tells the client

            async def node_to_client() -> None:
                try:
                    async for data in node_ws:
                        if isinstance(data, str):
                            await ws.send_text(data)
                        else:
                            await ws.send_bytes(data)
                except (WebSocketDisconnect, RuntimeError):
                    nursery.cancel_scope.cancel()  # the client is gone
                    return
                except ConnectionClosed:
                    pass
                received = node_ws.protocol.close_rcvd
                if received is None:  # no close frame: the node died under its socket
                    self.node_lost += 1
                    self.log.warning("node lost under a relayed socket", node=node)
                    message = f"node {node} was lost; its sessions are gone"
                    await _refuse(ws, json_wire, "node_lost", message, "server_error", 1011)
                else:
                    await _close(ws, received.code, received.reason)
                nursery.cancel_scope.cancel()

            nursery.start_soon(client_to_node)
            nursery.start_soon(node_to_client)


def _plain(offered: list[str]) -> str | None:
    """The subprotocol accepted before the node is known: the first that is not a key."""
    return next((p for p in offered if not p.startswith("openai-insecure-api-key")), None)


async def _refuse(
    ws: WebSocket, json_wire: bool, code: str, message: str, error_type: str, close: int
) -> None:
    """Tell the client (an ``error`` event on a JSON socket) and close with ``close``."""
    try:
        if ws.application_state is WebSocketState.CONNECTING:
            await ws.accept()
        if json_wire:
            await ws.send_text(_error(code, message, error_type))
    except (WebSocketDisconnect, RuntimeError):
        return
    await _close(ws, close, code)


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with suppress(WebSocketDisconnect, RuntimeError):
        await ws.close(code, reason)


class _Upload:
    """A request's body on its way to the node, as it arrives; notes whether it ended."""

    def __init__(self, request: Request) -> None:
        self._stream = request.stream()
        self.ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk
        self.ended = True

    async def drain(self) -> None:
        """After an answer the node gave before the body ended (a 413): read and drop the
        rest, up to `DRAIN_BYTES` and `DRAIN_S`, so a client that sends its whole body before
        it reads (most do) gets to read the answer (hypercorn holds an answer while the app
        leaves body unread); then the connection closes."""
        read = 0
        with trio.move_on_after(DRAIN_S), suppress(ClientDisconnect):
            async for chunk in self._stream:
                read += len(chunk)
                if read > DRAIN_BYTES:
                    return


def _passed(headers: Any, *, own: frozenset[str] = frozenset()) -> dict[str, str]:
    """The end-to-end headers of a request or an answer (RFC 9110: hop headers stay), less
    ``own`` (those our HTTP server sets itself)."""
    dropped = _HOP_HEADERS | own
    return {k.lower(): v for k, v in headers.items() if k.lower() not in dropped}


def _lost(node: str, exc: Exception) -> Response:
    """A node that did not answer an HTTP request (or broke off a JSON answer): 502."""
    return refusal_response(Refusal(502, f"node {node}: {exc!r}", "node_lost"))


def _wrap_ids(body: bytes, node: str) -> bytes:
    """A node's JSON answer with its video ids named as the cluster's (``object_id_on``)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body

    def wrap(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: object_id_on(node, v)
                if k == "id" and isinstance(v, str) and v.startswith("video_")
                else wrap(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [wrap(v) for v in value]
        return value

    return json.dumps(wrap(answer), separators=(",", ":")).encode()


async def serve_ingress(
    ingress: Ingress,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``ingress`` at ``host``:``port`` until cancelled; reports its base URL once bound
    and its first table arrived. It faces the clients as a server does, so it is served as
    one: `serve_http` (each connection guarded, the connection cap and its reserve), with
    its HTTP boundary's figures in its ``/metrics``."""
    config = hypercorn_config(
        f"{host}:{port}", max_frame_bytes=ingress.max_frame_bytes, graceful_timeout_s=1.0
    )
    config.websocket_max_message_size = ingress.max_frame_bytes  # the node says what is over
    async with trio.open_nursery() as nursery:
        await nursery.start(ingress.run)
        serve = partial(
            serve_http,
            ingress.app(),
            config,
            shutdown_trigger=trio.sleep_forever,
            registry=ingress.registry,
            announce=False,
        )
        binds = await nursery.start(serve)
        task_status.started(binds[0])
