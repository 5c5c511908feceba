"""The VAD actor: the shared silero VAD's tick loop under supervision.

Like `EngineActor`: a crash in a step (the VAD raised, or the driver did)
crashes this actor; its supervisor starts it again, ``build`` makes a fresh
`VadDriver` (fresh streams), and ``on_vad`` tells the owner (the session hub),
which moves every session with a stream onto it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

from duplex.actors import Actor, ActorContext

from ._vad_driver import VadDriver


@final
class VadActor(Actor[Any]):
    """Builds a VAD driver on every (re)start, runs its tick loop, hands it to ``on_vad``.

    ``build`` runs on the actor's own task: the first build loads the weights
    (server startup, after the port is bound and torch is imported: ``/health`` says
    ``starting`` meanwhile); a rebuild after a crash reuses the loaded torch and takes
    milliseconds.
    """

    def __init__(
        self,
        build: Callable[[], VadDriver],
        on_vad: Callable[[VadDriver], Awaitable[None]],
    ):
        self.build = build
        self.on_vad = on_vad

    async def on_restart(self, ctx: ActorContext, exc: BaseException) -> None:
        ctx.log.error("VAD crashed; starting a fresh one", error=repr(exc))

    async def on_start(self, ctx: ActorContext) -> None:
        driver = self.build()
        ctx.start_soon(driver.run)
        await self.on_vad(driver)

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None
