"""The HTTP server boundary: hypercorn's protocol code, run so that no peer can end the process.

Every process that serves the app (the server, each connection worker, the bare
echo of ``bench/sessions.py``) calls `serve_http` instead of
``hypercorn.trio.serve``. hypercorn's ``serve`` starts each connection in the
nursery that also runs the accept loops, so one exception a peer provokes in
its protocol code ends the whole server. hypercorn 0.18 has such exceptions:
a request with a ``Content-Length`` whose peer closes early raced its error
response against its own EOF (``trio.BusyResourceError``) and took the server
down within 1-7 such requests; trailing bytes after a WebSocket upgrade
request did it at once (upstream issues #203 and #225, both open). The fork
``anycorn`` 0.20.1 survives both reproductions, but starts connections the
same way (so any bug left in it would end the process too), fails the
WebSocket cases below in the same way, and used 13-20% more server CPU than
hypercorn for the same bare echo load (docs/operations.md, "Security"). So we
stay on hypercorn and own the boundary:

- each connection runs under a guard: what it raises is counted
  (``duplex_http_connection_errors_total``), logged (rate-limited), and ends
  that connection only;
- the EOF is sent only when no writer holds the socket (the root of the
  ``BusyResourceError`` above);
- WebSocket streams (`_WebSocketStream`) negotiate no extensions:
  permessage-deflate inflated a whole message before any size check (a 1 MB
  message inflating to 1 GiB), and 80 ms PCM frames gain little from it;
- a frame that breaks the protocol (bad UTF-8 in a text frame: 1007, a
  compressed or malformed frame: 1002) or a message over the size limit
  (1009) is answered with a close frame carrying that code, the app is told,
  and the TCP connection ends after a short linger; hypercorn dropped the
  connection without a close frame, or sent 1009 and then held the connection
  open without telling the app.

A TLS handshake on a plain-HTTP port (a client told ``https://`` or ``wss://`` for an
``http://`` server: OpenAI's beta Realtime client derives ``wss://`` from ``base_url``
whatever its scheme) is counted as ``tls_on_plain_port`` and logged with the setting that
fixes it; the client itself sees only ``SSL: WRONG_VERSION_NUMBER``.

Client frames are unmasked with numpy (`_wsmask.py`), not wsproto's own masker.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import resource
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import hypercorn.protocol.h2
import hypercorn.protocol.h11
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Data, Event, Request, StreamClosed
from hypercorn.protocol.ws_stream import FrameTooLargeError, WebsocketBuffer, WSStream
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import repr_socket_addr
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from duplex.actors import unwrap
from duplex.logs import get_logger
from duplex.metrics import REGISTRY, MetricsRegistry, Sample
from duplex.sessions import RefusalLog

from . import _wsmask
from ._connection_cap import ConnectionCap, auto_connection_limit, open_fds
from ._limits import CONNECTION, HeldConnections, throttle_accept_errors

_wsmask.install()

CLOSE_LINGER_S = 1.0
"""After a close frame the server sent for a bad frame, how long bytes still arriving are
read and dropped before the TCP connection is closed. Closing at once, with unread
bytes (the rest of an oversize message), would reset the connection, and the peer's
stack could drop the close frame before its client read it."""

ERROR_LOG_INTERVAL_S = 10.0
"""At most one log line per interval for connection errors of one kind; the rest are
counted in the line that follows."""


class PathLimitedConfig(HypercornConfig):
    """hypercorn's config, with a WebSocket message limit of its own for some paths.

    ``websocket_message_limits`` maps a path to the largest message read on it; every
    other path keeps ``websocket_max_message_size``. The robot endpoint reads 64 MiB
    observations without every other route buffering that much.
    """

    def __init__(self) -> None:
        super().__init__()
        self.websocket_message_limits: dict[str, int] = {}


class _WebSocketStream(WSStream):
    """hypercorn's WebSocket stream, with no extensions and a close frame for every bad frame."""

    _lingering = False
    _app_told_closed = False

    async def handle(self, event: Event) -> None:
        if isinstance(event, Request):
            headers = [(k, v) for k, v in event.headers if k.lower() != b"sec-websocket-extensions"]
            event = dataclasses.replace(event, headers=headers)
            if isinstance(self.config, PathLimitedConfig):
                path = event.raw_path.partition(b"?")[0].decode("latin-1")
                limit = self.config.websocket_message_limits.get(path)
                if limit is not None:
                    self.buffer = WebsocketBuffer(limit)
        elif isinstance(event, Data) and self._lingering:
            return  # after our close frame: read and dropped until the linger ends
        elif isinstance(event, StreamClosed) and self._app_told_closed:
            self.closed = True  # the app has its disconnect, with the code on the wire
            return
        await super().handle(event)

    async def _tell_app_closed(self, code: int, reason: str) -> None:
        """The app's one ``websocket.disconnect``, with ``code`` and ``reason``."""
        if self.app_put is not None and not self._app_told_closed:
            self._app_told_closed = True
            await self.app_put(
                {"type": "websocket.disconnect", "code": int(code), "reason": reason}
            )

    async def app_send(self, message: Any) -> None:
        if self._lingering and (message is None or message["type"] == "websocket.close"):
            return  # our close frame is out; the linger ends the connection
        await super().app_send(message)

    async def _handle_events(self) -> None:
        for event in self.connection.events():
            if isinstance(event, Message):
                try:
                    self.buffer.extend(event)
                except FrameTooLargeError:
                    await self._fail(CloseReason.MESSAGE_TOO_BIG, "message too big")
                    return
                if event.message_finished:
                    assert self.app_put is not None
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, CloseConnection):
                if self.connection.state is ConnectionState.OPEN:
                    # wsproto's verdict on a frame it could not accept (the peer sent no close)
                    await self._fail(event.code, event.reason or "")
                    return
                if self.connection.state is ConnectionState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                # the app hears the code and reason on the wire (hypercorn's own disconnect,
                # sent at StreamClosed, says 1006 for any close the peer began)
                await self._tell_app_closed(event.code, event.reason or "")
                await self.send(StreamClosed(stream_id=self.stream_id))

    async def _fail(self, code: int, reason: str) -> None:
        """Close with ``code``, tell the app, and end the connection after the linger."""
        await self._send_wsproto_event(CloseConnection(code=code, reason=reason))
        self.buffer.clear()
        self._lingering = True
        await self._tell_app_closed(code, reason)
        self.task_group.spawn(self._end_after_linger)

    async def _end_after_linger(self) -> None:
        await self.context.sleep(CLOSE_LINGER_S)
        if not self.closed:
            self.closed = True
            await self.send(StreamClosed(stream_id=self.stream_id))


def _use_guarded_websockets() -> None:
    """Make hypercorn's HTTP/1.1 and HTTP/2 protocols open `_WebSocketStream` s.

    Both modules build the stream by the name they imported, and there is no
    setting for it, so the name is rebound, once per process. hypercorn is pinned
    (``pyproject.toml``) and tests/transport/test_http_hostile.py fails if a new
    version stops honouring it.
    """
    for module in (hypercorn.protocol.h11, hypercorn.protocol.h2):
        if module.WSStream is not _WebSocketStream:
            assert module.WSStream is WSStream, f"{module.__name__}.WSStream is not hypercorn's"
            module.WSStream = _WebSocketStream  # type: ignore[misc]


TLS_RECORD_START: Final = b"\x16\x03"
"""The first bytes of a TLS handshake record (content type 22, version 3.x); no HTTP
request starts so."""

TLS_ON_PLAIN_PORT: Final = (
    "a TLS handshake arrived on a plain-HTTP port: the client was given https:// or wss:// "
    "for this http:// server. OpenAI's beta Realtime client (client.beta.realtime) derives "
    "wss:// from base_url whatever its scheme: give it websocket_base_url='ws://HOST:PORT/v1'"
)


class _Connection(TCPServer):
    """One TCP connection, with its EOF sent only while no writer holds the socket."""

    on_tls: Callable[[], None] | None = None
    """Called when the first bytes on a plain-HTTP connection are a TLS handshake."""

    async def _read_data(self) -> None:
        """hypercorn 0.18's read loop (``TCPServer._read_data``), with a look at the first
        bytes (a TLS handshake)."""
        first = True
        while True:
            try:
                with trio.fail_after(self.config.read_timeout or math.inf):
                    data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                break
            if first and self.on_tls is not None and bytes(data[:2]) == TLS_RECORD_START:
                self.on_tls()
            first = False
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())

    async def _close(self) -> None:
        if self.send_lock.statistics().owner is not None:
            # a writer is in send_all (maybe stalled on a peer that reads nothing): EOF would
            # race it (BusyResourceError); closing the socket ends its send instead
            await self.stream.aclose()
            return
        self.send_lock.acquire_nowait()  # no await since the check: it is free
        try:
            await super()._close()
        finally:
            self.send_lock.release()


class _ErrorLog:
    """Counts connection errors; logs the first of each kind and then one per interval."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.counter = registry.counter(
            "duplex_http_connection_errors_total",
            "Connections ended by an error in the HTTP/WebSocket code (the server lives on)",
            ("kind",),
        )
        self.log = get_logger(component="http")
        self.rate = RefusalLog(ERROR_LOG_INTERVAL_S)

    def tls_on_plain_port(self) -> None:
        """A client spoke TLS to a plain-HTTP port (hypercorn answers it 400 and closes)."""
        kind = "tls_on_plain_port"
        self.counter.inc(kind=kind)
        unlogged = self.rate.note(kind, trio.current_time())
        if unlogged is not None:
            self.log.warning(
                "connection error", kind=kind, error=TLS_ON_PLAIN_PORT, unlogged_since_last=unlogged
            )

    def record(self, exc: BaseException) -> None:
        kind = type(exc).__name__
        self.counter.inc(kind=kind)
        unlogged = self.rate.note(kind, trio.current_time())
        if unlogged is not None:
            self.log.warning(
                "connection error", kind=kind, error=str(exc)[:200], unlogged_since_last=unlogged
            )


def connection_cap(max_connections: int) -> ConnectionCap:
    """The cap this process serves under: ``max_connections`` (0: what its descriptors and
    memory afford, `auto_connection_limit`), with half the descriptor reserve as overflow."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit, overflow = auto_connection_limit(soft, open_fds(), memory)
    return ConnectionCap(max_connections or limit, overflow)


class _ConnectionMetrics:
    """The cap's figures at each scrape, and what it shed."""

    def __init__(self, cap: ConnectionCap, registry: MetricsRegistry) -> None:
        self.shed = registry.counter(
            "duplex_http_connections_shed_total",
            "Connections the cap ended or turned away: evicted_idle / evicted_uploading (the "
            "longest-waiting connection, closed for a new one), busy (an overflow connection's "
            "request answered 503 server_busy), closed (past the overflow, closed at accept)",
            ("reason",),
        )

        def held() -> Iterator[Sample]:
            idle, uploading = cap.waiting()
            yield Sample("duplex_http_connections", {"state": "idle"}, idle)
            yield Sample("duplex_http_connections", {"state": "uploading"}, uploading)
            working = cap.held - idle - uploading
            yield Sample("duplex_http_connections", {"state": "working"}, working)
            yield Sample("duplex_http_connections", {"state": "overflow"}, cap.overflowing)

        def limit() -> Iterator[Sample]:
            yield Sample("duplex_http_connections_limit", {}, cap.limit)

        registry.add_collector(
            "duplex_http_connections", "gauge",
            "TCP connections this process holds, by state (overflow: beyond the limit, served "
            "/health and /metrics only)", held,
        )  # fmt: skip
        registry.add_collector(
            "duplex_http_connections_limit", "gauge",
            "Connections this process serves in full at once (server.max_connections)", limit,
        )  # fmt: skip


async def serve_http(
    app: Any,
    config: HypercornConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]],
    registry: MetricsRegistry = REGISTRY,
    announce: bool = True,
    max_connections: int = 0,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``config``'s binds until ``shutdown_trigger`` returns; reports the binds.

    ``announce``: log one ``listening`` line with every bound URL (the real port when
    0 was asked); a connection worker, which serves the server's own listener, does not.
    ``max_connections``: the connections served in full at once (0: from the process's
    descriptors and memory; `connection_cap`).

    Then accepting stops, idle keep-alive connections close, and connections
    still open get ``config.graceful_timeout`` to finish before they are cancelled.
    """
    _use_guarded_websockets()
    throttle_accept_errors()
    errors = _ErrorLog(registry)
    context = WorkerContext(None)
    cap = connection_cap(max_connections)
    counted = _ConnectionMetrics(cap, registry)
    busy = functools.partial(counted.shed.inc, reason="busy")
    wrapped = ASGIWrapper(HeldConnections(app, cap, on_busy=busy))
    sockets = config.create_sockets()
    ssl_context = config.create_ssl_context()
    listeners: list[trio.abc.Listener[Any]] = []
    binds: list[str] = []
    for sock in sockets.secure_sockets:
        sock.listen(config.backlog)
        plain = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        listeners.append(trio.SSLListener(plain, ssl_context, https_compatible=True))
        binds.append(f"https://{repr_socket_addr(sock.family, sock.getsockname())}")
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")

    async def connection(stream: Any) -> None:
        admitted = cap.accept()
        held = admitted.held
        if held is None:
            counted.shed.inc(reason="closed")
            await trio.aclose_forcefully(stream)
            return
        if admitted.evicted is not None and admitted.evicted.evict is not None:
            counted.shed.inc(reason=f"evicted_{admitted.evicted_as}")
            admitted.evicted.evict()
        try:
            with trio.CancelScope() as scope:
                held.evict = scope.cancel
                CONNECTION.set(held)  # this task's context: its requests' tasks inherit it
                served = _Connection(wrapped, config, context, {}, stream)
                if isinstance(stream, trio.SocketStream):  # a plain-HTTP listener's
                    served.on_tls = errors.tls_on_plain_port
                await served.run()
            if scope.cancelled_caught:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(stream)
        except* Exception as group:  # Cancelled (shutdown) passes through
            for exc in group.exceptions:
                errors.record(unwrap(exc))  # hypercorn's task group nests them
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
        finally:
            cap.release(held)

    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            serve = functools.partial(trio.serve_listeners, handler_nursery=connections)
            for listener in listeners:
                accepting.start_soon(serve, connection, [listener])
            if announce:
                errors.log.info("listening", urls=binds)
            task_status.started(binds)
            await shutdown_trigger()
            accepting.cancel_scope.cancel()
        for listener in listeners:
            await listener.aclose()
        await context.terminated.set()  # idle keep-alive connections close now
        connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
