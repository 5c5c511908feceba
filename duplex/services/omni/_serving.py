"""``POST /v1/omni/sleep`` and ``POST /v1/omni/wakeup``: an operator puts the engine to sleep
(its memory given back) and wakes it. Behind the API key like every route (the access
layer runs first); with connection workers relayed to the server process like the other
service routes.

``sleep`` takes ``{"force": true}`` (or ``?force=true``) to end live sessions; without it
a server with live sessions answers 409 ``sessions_live``. While asleep every other
service route answers 503 ``engine_sleeping`` with ``Retry-After`` (`gated_while_asleep`),
a service socket is closed 1013 with that reason, and new sessions are refused
``engine_sleeping`` by the hub.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final, Protocol, final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from duplex.exceptions import ProtocolError
from duplex.refusals import Refusal, echo
from duplex.transport import refusal_response
from duplex.wire import dumps

__all__ = ["SLEEPING", "EngineSleep", "OmniService", "gated_while_asleep", "omni_routes"]

RETRY_AFTER_S: Final = 5.0
SLEEPING: Final = Refusal(
    503,
    "The engine is asleep (POST /v1/omni/sleep): retry once an operator wakes it "
    "(POST /v1/omni/wakeup).",
    "engine_sleeping",
    retry_after_s=RETRY_AFTER_S,
    close_code=1013,
)
MAX_BODY: Final = 1024


class EngineSleep(Protocol):
    """What puts the engine to sleep and wakes it (``duplex.topology``'s)."""

    @property
    def asleep(self) -> bool: ...

    async def sleep(self, *, force: bool = False) -> dict[str, Any]: ...

    async def wake(self) -> dict[str, Any]: ...


def _force(request: Request, body: bytes) -> bool:
    """``force`` from the query or a JSON body (``{"force": true}``).

    Raises:
        ProtocolError: a body that is not such an object, or a ``force`` not a boolean.
    """
    query = request.query_params.get("force")
    if query is not None:
        if query not in ("true", "false", "1", "0"):
            raise ProtocolError(f"'force' must be true or false, got {echo(query)}.", param="force")
        return query in ("true", "1")
    if not body.strip():
        return False
    try:
        parsed = json.loads(body)
    except ValueError:
        raise ProtocolError('The body must be a JSON object, like {"force": true}.') from None
    if not isinstance(parsed, dict) or set(parsed) - {"force"}:
        raise ProtocolError("The body takes only 'force'.", param="force")
    force = parsed.get("force", False)
    if not isinstance(force, bool):
        raise ProtocolError("'force' must be a boolean.", param="force")
    return force


@final
class OmniService:
    """The operator routes over the server's `EngineSleep`."""

    def __init__(self, sleep: EngineSleep) -> None:
        self.sleep = sleep

    async def put_to_sleep(self, request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return refusal_response(Refusal(413, "The body is too large.", "body_too_large"))
        try:
            answer = await self.sleep.sleep(force=_force(request, body))
        except ProtocolError as exc:
            return refusal_response(Refusal.of(exc))
        return Response(dumps(answer), media_type="application/json")

    async def wake(self) -> Response:
        try:
            answer = await self.sleep.wake()
        except ProtocolError as exc:
            return refusal_response(Refusal.of(exc))
        return Response(dumps(answer), media_type="application/json")


def omni_routes(omni: OmniService | None) -> list[BaseRoute]:
    """The operator routes (``None``: a worker's shapes, or a server that cannot sleep)."""
    unsupported = Refusal(501, "This server cannot sleep.", "sleep_unsupported")

    async def sleep(request: Request) -> Response:
        if omni is None:
            return refusal_response(unsupported)
        return await omni.put_to_sleep(request)

    async def wakeup(request: Request) -> Response:
        return refusal_response(unsupported) if omni is None else await omni.wake()

    return [
        Route("/v1/omni/sleep", sleep, methods=["POST"]),
        Route("/v1/omni/wakeup", wakeup, methods=["POST"]),
    ]


def gated_while_asleep(routes: Sequence[BaseRoute], sleep: EngineSleep | None) -> list[BaseRoute]:
    """``routes``, each answering `SLEEPING` while ``sleep`` is asleep (``None``: as they are).
    An HTTP route answers 503 with ``Retry-After``; a socket is accepted, told the error
    and closed 1013."""
    if sleep is None:
        return list(routes)
    gated: list[BaseRoute] = []
    for route in routes:
        if isinstance(route, Route):
            gated.append(
                Route(
                    route.path,
                    _http_gate(route.endpoint, sleep),
                    methods=route.methods,
                    name=route.name,
                )
            )
        elif isinstance(route, WebSocketRoute):
            gate = _socket_gate(route.endpoint, sleep)
            gated.append(WebSocketRoute(route.path, gate, name=route.name))
        else:
            gated.append(route)
    return gated


def _http_gate(endpoint: Any, sleep: EngineSleep) -> Any:
    async def gate(request: Request) -> Response:
        if sleep.asleep:
            return refusal_response(SLEEPING)
        return await endpoint(request)  # type: ignore[no-any-return]

    return gate


def _socket_gate(endpoint: Any, sleep: EngineSleep) -> Any:
    async def gate(websocket: WebSocket) -> None:
        if sleep.asleep:
            await websocket.accept()
            error = {"type": "error", "code": SLEEPING.code, "message": SLEEPING.message}
            await websocket.send_text(dumps(error))
            await websocket.close(SLEEPING.close_code, SLEEPING.code)
            return
        await endpoint(websocket)

    return gate
