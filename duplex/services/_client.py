"""What every request route needs of its client: run the work unless the client leaves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from starlette.requests import Request

__all__ = ["unless_gone"]


async def unless_gone(request: Request, work: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
    """Run ``work`` while watching the client: ``(False, None)`` if it left first (the work is
    cancelled, which withdraws its engine requests), else ``(True, result)``; what ``work``
    raises is raised here, as itself."""
    outcome: list[Any] = []
    failure: list[Exception] = []

    async def run(cancel: trio.CancelScope) -> None:
        try:
            outcome.append(await work())
        except Exception as exc:  # re-raised below, outside the nursery's group
            failure.append(exc)
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, nursery.cancel_scope)
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                nursery.cancel_scope.cancel()
                break
    if failure:
        raise failure[0]
    return (True, outcome[0]) if outcome else (False, None)
