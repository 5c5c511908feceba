"""Robot policy connections (``/v1/realtime/robot/openpi``): one actor per robot socket.

A `RobotConnection` moves frames between its socket and the policy engine and
owns nothing else: the protocol's state is its `OpenPIProtocol` (sans-I/O,
``_openpi_wire.py``), batching and inference are the engine's (a
``duplex.models.RequestEngine`` over a `PolicyRunner`, reached through
`RobotService`). It reads one frame, answers it, and only then reads the next,
as OpenPI's clients expect:
one request in flight per robot, so a robot's own requests never batch
together, and many robots' do.

Idle: a socket that sends no frame for ``idle_timeout_s`` (30 s) is closed with
1000 ``idle_timeout``; the time its own inference takes never counts. On
shutdown every robot socket is closed with 1001, as the session sockets are.

Logs: ``robot connected`` / ``robot disconnected`` (code, reason, who closed,
counts) at info; ``bad robot frame`` (the refusal's reason, never the frame)
at warning for the first `BAD_FRAMES_LOGGED` of a socket; ``robot inference
failed`` (the cause's type and message) at warning, for every failure.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, final

import trio
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState

from duplex.actors import Actor, ActorContext, ActorRef, ActorSystem, LaneSpec, Restart
from duplex.exceptions import EngineUnavailable, InvalidPayload, RequestFailed, RequestsOverloaded
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry
from duplex.models import PolicyRequest
from duplex.refusals import Refusal
from duplex.runtime import RequestEngines, RequestService
from duplex.transport import ShutDown, SocketGone, refuse_upgrade
from duplex.wire import (
    MAX_PAYLOAD_BYTES,
    Answer,
    Infer,
    OpenPIProtocol,
)
from duplex.wire import (
    OPENPI_NOT_AVAILABLE as NOT_AVAILABLE,
)
from duplex.wire import (
    openpi_error_frame as error_frame,
)

BAD_FRAMES_LOGGED: Final = 3
"""Bad frames of one socket logged one by one; later ones are only counted (at close)."""

DEFAULT_IDLE_TIMEOUT_S: Final = 30.0
OVERLOADED: Final = "Policy overloaded"
UNAVAILABLE: Final = "Policy unavailable: its engine is restarting"
"""The answer while the engine process that hosts the policy is down or restarting (the
robot keeps its socket and may send again; nothing ran)."""
POLICY: Final = "policy"
"""The request engine the robots' policy runs on (`PolicyRunner.name`)."""
"""The error frame's message when the policy engine's queue is full (the request did not run)."""


class FrameSocket(Protocol):
    """One robot's socket, as whole frames."""

    @property
    def open(self) -> bool: ...

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        """The close code and reason of a peer that left; ``None`` before."""
        ...

    async def receive(self) -> bytes | str | None:
        """The next frame (``str``: a text frame); ``None`` when the peer left."""
        ...

    async def send(self, frame: bytes) -> None:
        """Write one binary frame; raises ``SocketGone`` when the peer is gone."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code``; a socket already gone is fine."""
        ...


@final
class WebSocketFrames:
    """A Starlette WebSocket as a `FrameSocket`."""

    def __init__(self, websocket: WebSocket) -> None:
        self.ws = websocket
        self._peer_close: tuple[int | None, str] | None = None

    @property
    def open(self) -> bool:
        return self.ws.application_state is WebSocketState.CONNECTED

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        return self._peer_close

    async def receive(self) -> bytes | str | None:
        try:
            message = await self.ws.receive()
        except RuntimeError:  # starlette: the socket was closed under us
            self._peer_close = self._peer_close or (None, "")
            return None
        if message["type"] == "websocket.disconnect":
            self._peer_close = (message.get("code", 1005), message.get("reason") or "")
            return None
        text = message.get("text")
        return text if text is not None else (message.get("bytes") or b"")

    async def send(self, frame: bytes) -> None:
        try:
            await self.ws.send_bytes(frame)
        except (OSError, RuntimeError, trio.BrokenResourceError) as exc:
            raise SocketGone from exc

    async def close(self, code: int, reason: str) -> None:
        if self.open:
            with contextlib.suppress(OSError, RuntimeError, trio.BrokenResourceError):
                await self.ws.close(code, reason)


class Registry(Protocol):
    """Where live connection actors are kept, so a shutdown reaches them (``_app.Connections``)."""

    async def add(self, ref: ActorRef[Any]) -> None: ...

    def remove(self, ref: ActorRef[Any]) -> None: ...


@final
@dataclass(frozen=True, slots=True)
class RobotCounters:
    """What robot connections count (Prometheus counters, or ``None`` without a registry)."""

    connections: Callable[[], None]
    refused: Callable[[str], None]

    @classmethod
    def of(cls, registry: MetricsRegistry | None) -> RobotCounters:
        if registry is None:
            return cls(lambda: None, lambda reason: None)
        opened = registry.counter("duplex_robot_connections_total", "Robot policy sockets accepted")
        refused = registry.counter(
            "duplex_robot_errors_total",
            "Robot requests answered with an error frame, by reason",
            ["reason"],
        )
        return cls(opened.inc, lambda reason: refused.inc(reason=reason))


@final
class RobotService:
    """The robot endpoint's side of the server: the current policy engine and its sockets.

    Args:
        system: where each connection's actor lives.
        connections: the server's live connections (shutdown closes them with 1001).
        requests: the process's request engines; the policy is the one named ``policy``.
        registry: where robot metrics go (``None``: nowhere).
        idle_timeout_s: close a socket that sends nothing this long (0: never).
        max_payload_bytes: larger inbound frames are refused.
    """

    def __init__(
        self,
        system: ActorSystem,
        connections: Registry,
        requests: RequestEngines,
        registry: MetricsRegistry | None = None,
        *,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        self.system = system
        self.connections = connections
        self.requests = requests
        self.idle_timeout_s = idle_timeout_s
        self.max_payload_bytes = max_payload_bytes
        self.counters = RobotCounters.of(registry)
        self._clients = itertools.count(1)

    @property
    def engine(self) -> RequestService | None:
        """The policy's engine now (``None``: not running yet, or restarting)."""
        return self.requests.get(POLICY)

    async def connect(self, socket: FrameSocket, *, peer: str | None = None) -> None:
        """Run one robot socket until it ends."""
        client = next(self._clients)
        self.counters.connections()
        ref = await self.system.spawn(
            RobotConnection, socket, self, client, peer, name=f"robot-{client}",
            restart=Restart.TEMPORARY,
        )  # fmt: skip
        await self.connections.add(ref)
        try:
            await ref.wait_stopped()
        finally:
            self.connections.remove(ref)
        if socket.open:  # the actor crashed
            await socket.close(1011, "internal_error")


@final
class RobotConnection(Actor[Any]):
    """One robot's socket: handshake, then one request at a time until it leaves."""

    lanes: ClassVar[tuple[LaneSpec, ...]] = (
        LaneSpec("control", capacity=4, priority=0),
        LaneSpec("data", capacity=4, priority=10),
    )

    def __init__(
        self, socket: FrameSocket, service: RobotService, client: int, peer: str | None
    ) -> None:
        self.socket = socket
        self.service = service
        self.client = client
        self.peer = peer
        engine = service.engine
        metadata = engine.metadata if engine is not None else {}
        self.protocol = OpenPIProtocol(metadata, max_payload_bytes=service.max_payload_bytes)
        self.closed_with: tuple[int, str] | None = None
        self.failures = 0

    async def on_start(self, ctx: ActorContext) -> None:
        ctx.log.info("robot connected", client=self.client, peer=self.peer)
        ctx.start_soon(self._serve, ctx)

    async def on_stop(self, ctx: ActorContext) -> None:
        by = "server"
        if self.closed_with is None and self.socket.peer_close is not None:
            by, (code, reason) = "client", self.socket.peer_close
        else:
            code, reason = self.closed_with or (1001, "server_shutdown")
        if self.socket.open:
            with trio.move_on_after(1):
                await self.socket.close(code or 1001, reason)
        ctx.log.info(
            "robot disconnected",
            client=self.client,
            peer=self.peer,
            code=code,
            reason=reason,
            by=by,
            inferences=self.protocol.inferences,
            bad_frames=self.protocol.refused,
            failures=self.failures,
        )

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        if isinstance(message, ShutDown):
            ctx.stop()  # on_stop closes with 1001
        return None

    async def _serve(self, ctx: ActorContext) -> None:
        try:
            await self.socket.send(self.protocol.handshake())
            while True:
                frame = await self._next_frame()
                if frame is None:
                    break
                decision = self.protocol.receive(frame, trio.current_time())
                if isinstance(decision, Answer):
                    if decision.error is not None:
                        self._bad_frame(ctx, decision.error)
                    await self.socket.send(decision.frame)
                    continue
                await self.socket.send(await self._infer(ctx, decision))
                self.protocol.sent(trio.current_time())
        except SocketGone:
            pass
        ctx.stop()

    async def _next_frame(self) -> bytes | str | None:
        """The next frame; ``None`` when the peer left or the socket was idle too long."""
        timeout = self.service.idle_timeout_s
        with trio.move_on_after(timeout if timeout > 0 else float("inf")):
            return await self.socket.receive()
        self.closed_with = (1000, "idle_timeout")
        self.service.counters.refused("idle_timeout")
        return None

    async def _infer(self, ctx: ActorContext, infer: Infer) -> bytes:
        engine = self.service.engine
        if engine is None:  # its engine process is restarting: the robot may send again
            self.service.counters.refused("engine_unavailable")
            return error_frame(UNAVAILABLE)
        request = PolicyRequest(infer.observation, infer.session_id, infer.reset, self.client)
        try:
            reply = await engine.submit_timed(request)
            return self.protocol.inferred(reply.result, reply.run_ms)
        except RequestsOverloaded:
            self.service.counters.refused("overloaded")
            return error_frame(OVERLOADED)
        except EngineUnavailable as exc:  # the engine process died under it: not the policy
            self.service.counters.refused("engine_unavailable")
            ctx.log.warning("robot inference failed", client=self.client,
                            reason="engine_unavailable", error=str(exc)[:200])  # fmt: skip
            return error_frame(UNAVAILABLE)
        except (RequestFailed, ValueError, TypeError) as exc:  # the robot hears only that it failed
            self.failures += 1
            self.service.counters.refused("inference_failed")
            cause = exc.__cause__ or exc
            ctx.log.warning(
                "robot inference failed",
                client=self.client,
                session_id=infer.session_id[:64],
                error=f"{type(cause).__name__}: {str(cause)[:200]}",
            )
            return self.protocol.failed()

    def _bad_frame(self, ctx: ActorContext, exc: InvalidPayload) -> None:
        self.service.counters.refused("invalid_payload")
        if self.protocol.refused <= BAD_FRAMES_LOGGED:
            ctx.log.warning("bad robot frame", client=self.client, reason=exc.message[:200])


ROBOT_PATH: Final = "/v1/realtime/robot/openpi"
ROOT_PATH: Final = "/"
"""Where OpenPI's own client connects given only a host and a port
(``WebsocketClientPolicy(host, port)`` opens ``ws://host:port/``): a WebSocket upgrade
on ``/`` is the robot endpoint while a policy is served. An HTTP ``GET /`` stays the
browser page."""

NO_POLICY_AT_ROOT: Final = (
    "A WebSocket on / is the OpenPI robot endpoint, and this server runs no robot policy "
    "(policy.model = none). Start it with --policy reference or --policy module:factory; "
    "OpenAI Realtime clients connect to /v1/realtime, native clients to /v1/duplex, Moshi "
    "clients to /api/chat."
)


def robot_routes(
    robots: RobotService | None, registry: MetricsRegistry | None = None
) -> list[BaseRoute]:
    """The robot endpoint (OpenPI's protocol), at `ROBOT_PATH` and at `ROOT_PATH`.

    Without a policy (``None``): on `ROBOT_PATH` vLLM-Omni's ``Robot policy not available``
    text frame and a close; on `ROOT_PATH` the upgrade is refused (404, the body says
    why; logged, and counted in ``registry`` as ``policy_not_loaded``). A connection
    worker relays both whole to the server process, where the policy's engine is
    (``topology/_relay.py``)."""
    log = get_logger(component="robots")
    counters = robots.counters if robots is not None else RobotCounters.of(registry)

    async def robot_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        peer = websocket.client.host if websocket.client else None
        if robots is None or robots.engine is None:
            unavailable = {"type": "error", "error": NOT_AVAILABLE, "code": "unsupported"}
            await websocket.send_text(json.dumps(unavailable))
            await websocket.close(1000, "policy_unavailable")
            return
        await robots.connect(WebSocketFrames(websocket), peer=peer)

    async def root_socket(websocket: WebSocket) -> None:
        if robots is not None:
            await robot_socket(websocket)
            return
        refusal = Refusal(404, NO_POLICY_AT_ROOT, "policy_not_loaded")
        counters.refused(refusal.code)
        log.warning(
            "robot refused",
            path=ROOT_PATH,
            peer=websocket.client.host if websocket.client else None,
            status=refusal.status,
            code=refusal.code,
        )
        await refuse_upgrade(websocket, refusal)

    return [WebSocketRoute(ROBOT_PATH, robot_socket), WebSocketRoute(ROOT_PATH, root_socket)]
