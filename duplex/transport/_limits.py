"""Limits of the socket shell that no single request breaks: body deadlines, file descriptors.

- `BodyDeadline`: an HTTP request body must arrive within ``timeout_s`` plus one second
  per `MIN_BODY_RATE` bytes already received. A peer that stalls or trickles its body
  (slowloris) holds a socket and a task each; without a deadline 200 such bodies stayed
  open for minutes and 1,100 took ``/health`` offline. Past it the app is told the
  client left (``http.disconnect``), the peer gets 408 and the connection closes.
- `raise_fd_limit`: the soft limit of open files raised to the hard one at start (1024
  is a common default, below what a busy server holds).
- `throttle_accept_errors`: trio's accept loop logs every ``EMFILE`` it sleeps on (49k
  lines in a minute when fds ran out); one line per interval now, with the count.
- `HeldConnections`: tells the connection cap (`_connection_cap.py`) when each request
  starts, has its body and ends, and answers an overflow connection only ``/health``
  and ``/metrics`` (the rest: ``503 server_busy``).
"""

from __future__ import annotations

import contextvars
import logging
import resource
import time
from typing import Any, Final, final

import trio

from duplex.logs import get_logger
from duplex.refusals import Refusal

from ._connection_cap import ConnectionCap, Held

__all__ = [
    "CONNECTION",
    "MIN_BODY_RATE",
    "SERVER_BUSY",
    "BodyDeadline",
    "HeldConnections",
    "deny",
    "has_body",
    "raise_fd_limit",
    "throttle_accept_errors",
]

MIN_BODY_RATE: Final = 4096
"""Bytes per second a request body must keep up, beyond its first ``timeout_s``."""
ACCEPT_LOG_INTERVAL_S: Final = 10.0

BODY_TIMEOUT = Refusal(
    408,
    "The request body did not arrive in time (a body must arrive within server."
    "http_body_timeout_s, then at 4 KiB/s at least).",
    "body_timeout",
    headers=(("Connection", "close"),),
)


SERVER_BUSY = Refusal(
    503,
    "Every connection this server holds is working (server.max_connections); try again shortly.",
    "server_busy",
    close_code=1013,
    retry_after_s=1,
    headers=(("Connection", "close"),),
)

OVERFLOW_PATHS: Final = frozenset({"/health", "/metrics"})
"""What an overflow connection is answered: enough for a probe and an operator."""

CONNECTION: contextvars.ContextVar[Held | None] = contextvars.ContextVar(
    "duplex_connection", default=None
)
"""The connection a request arrived on: set by the HTTP boundary in each connection's
task, inherited by the tasks hypercorn starts for its requests."""


async def deny(scope: dict[str, Any], receive: Any, send: Any, denied: Refusal) -> None:
    """Answer an HTTP request or a WebSocket handshake with ``denied``."""
    body = denied.body_bytes()
    headers = [(name.encode(), value.encode()) for name, value in denied.http_headers()]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": denied.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    message = await receive()  # websocket.connect
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        start = {"type": "websocket.http.response.start", "status": denied.status}
        await send({**start, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # a server without the denial response: closing before accepting is a 403
        await send({"type": "websocket.close", "code": denied.close_code})


def has_body(scope: dict[str, Any]) -> bool:
    """An HTTP request with a body to read (chunked, or a non-zero ``Content-Length``)."""
    for name, value in scope.get("headers", ()):
        lowered = name.lower()
        if lowered == b"transfer-encoding":
            return True
        if lowered == b"content-length" and value.strip() != b"0":
            return True
    return False


@final
class HeldConnections:
    """Pure ASGI middleware: each request's part in its connection's place under the cap.

    Args:
        app: the app it wraps.
        cap: the serving process's connection cap.
        on_busy: called once per request refused ``server_busy`` (a counter).
    """

    def __init__(self, app: Any, cap: ConnectionCap, on_busy: Any = None) -> None:
        self.app = app
        self.cap = cap
        self.on_busy = on_busy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        held = CONNECTION.get()
        if held is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if held.evicted:
            return  # its connection is being closed (the cancellation reaches it next)
        if held.overflow:
            if scope["type"] == "http" and scope.get("path") in OVERFLOW_PATHS:
                await self.app(scope, receive, _closing(send))
                return
            if self.on_busy is not None:
                self.on_busy()
            await deny(scope, receive, send, SERVER_BUSY)
            return
        body = scope["type"] == "http" and has_body(scope)
        arrived = not body
        self.cap.begin(held, body=body)

        async def tracked_receive() -> dict[str, Any]:
            nonlocal arrived
            message: dict[str, Any] = await receive()
            if not arrived and (
                message["type"] == "http.disconnect" or not message.get("more_body", False)
            ):
                arrived = True
                self.cap.body_done(held)
            return message

        try:
            await self.app(scope, tracked_receive, send)
        finally:
            self.cap.end(held, body_done=arrived)


def _closing(send: Any) -> Any:
    """``send``, with ``Connection: close`` on the response (an overflow connection ends)."""

    async def closing_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = {**message, "headers": headers}
        await send(message)

    return closing_send


@final
class BodyDeadline:
    """Pure ASGI middleware: an HTTP request's body within its deadline, or 408.

    Args:
        app: the app it guards.
        timeout_s: the time a body may take before its rate counts (0: no deadline).
        on_timeout: called once per request cut short (a counter, a log).
    """

    def __init__(self, app: Any, timeout_s: float, on_timeout: Any = None) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.timeout_s:
            await self.app(scope, receive, send)
            return
        started = trio.current_time()
        received = 0
        done = False
        expired = False
        answered = False

        async def timed_receive() -> dict[str, Any]:
            nonlocal received, done, expired
            if done or expired:
                return await receive()  # type: ignore[no-any-return]
            deadline = started + self.timeout_s + received / MIN_BODY_RATE
            with trio.move_on_at(deadline):
                message: dict[str, Any] = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    done = not message.get("more_body", False)
                return message
            expired = True
            if self.on_timeout is not None:
                self.on_timeout(scope, received, trio.current_time() - started)
            return {"type": "http.disconnect"}

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal answered
            if expired:
                return  # the 408 below is the answer
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        await self.app(scope, timed_receive, guarded_send)
        if expired and not answered:
            headers = [(k.encode(), v.encode()) for k, v in BODY_TIMEOUT.http_headers()]
            await send({"type": "http.response.start", "status": 408, "headers": headers})
            await send({"type": "http.response.body", "body": BODY_TIMEOUT.body_bytes()})


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit; returns both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


@final
class _OncePerInterval(logging.Filter):
    """Lets one record through per interval; the next one says how many were dropped."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.last = -float("inf")
        self.dropped = 0
        self.log = get_logger(component="http")

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.dropped += 1
            return False
        self.last = now
        self.log.warning(
            "accept failed: out of file descriptors or memory; new connections wait",
            error=record.getMessage()[:200],
            unlogged_since_last=self.dropped,
        )
        self.dropped = 0
        return False  # said above, in our own log's shape


def throttle_accept_errors(interval_s: float = ACCEPT_LOG_INTERVAL_S) -> None:
    """One line per ``interval_s`` for trio's ``EMFILE``/``ENFILE``/``ENOMEM`` accept errors."""
    logger = logging.getLogger("trio.serve_listeners")
    if not any(isinstance(f, _OncePerInterval) for f in logger.filters):
        logger.addFilter(_OncePerInterval(interval_s))
