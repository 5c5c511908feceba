"""The engine actor: one engine's tick loop under supervision.

A crash inside a step (the runner raised, or the driver did) crashes this
actor; its supervisor starts a fresh engine, and ``on_engine`` tells the
owner (the session hub), which moves every live session onto it. Sessions
are told, never left waiting on a dead engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

from duplex.actors import Actor, ActorContext

from ._driver import EngineDriver, Offload


@final
class EngineActor(Actor[Any]):
    """Builds a driver on every (re)start, runs its tick loop, hands it to ``on_engine``.

    Args:
        build: makes a fresh driver (loads the model: seconds for a 7B checkpoint).
        on_engine: told each new driver.
        offload: runs ``build`` off the event loop (the server passes
            ``trio.to_thread.run_sync``, so a model load never stalls live sockets
            or the other actors); ``None`` builds inline.
    """

    def __init__(
        self,
        build: Callable[[], EngineDriver],
        on_engine: Callable[[EngineDriver], Awaitable[None]],
        offload: Offload | None = None,
    ):
        self.build = build
        self.on_engine = on_engine
        self.offload = offload

    async def on_restart(self, ctx: ActorContext, exc: BaseException) -> None:
        ctx.log.error("engine crashed; starting a fresh one", error=repr(exc))

    async def on_start(self, ctx: ActorContext) -> None:
        driver = self.build() if self.offload is None else await self.offload(self.build)
        ctx.start_soon(driver.run)
        await self.on_engine(driver)

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None
