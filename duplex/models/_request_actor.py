"""The request actor: one request engine's loop under supervision.

The runner is built off the event loop (``offload``: a checkpoint load or a
CUDA warm-up takes seconds), its engine's loop runs beside the actor, and
``on_engine`` tells the owner (the endpoint's service) of each new engine.
The loop ending with an error crashes this actor; its supervisor builds a
fresh engine, and requests that were waiting on the old one have already
been failed by its loop (`RequestEngine.run`), never left hanging.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

from duplex.actors import Actor, ActorContext

from ._driver import Offload
from ._requests import RequestEngine


@final
class RequestActor(Actor[Any]):
    """Builds a `RequestEngine` on every (re)start, runs its loop, hands it to ``on_engine``.

    Args:
        build: makes a fresh engine (builds the model).
        on_engine: told each new engine.
        offload: runs ``build`` off the event loop; ``None`` builds inline.
    """

    def __init__(
        self,
        build: Callable[[], RequestEngine[Any, Any]],
        on_engine: Callable[[RequestEngine[Any, Any]], Awaitable[None]],
        offload: Offload | None = None,
    ):
        self.build = build
        self.on_engine = on_engine
        self.offload = offload

    async def on_restart(self, ctx: ActorContext, exc: BaseException) -> None:
        ctx.log.error("request engine crashed; starting a fresh one", error=repr(exc))

    async def on_start(self, ctx: ActorContext) -> None:
        engine = self.build() if self.offload is None else await self.offload(self.build)
        ctx.start_soon(engine.run)
        await self.on_engine(engine)

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None
