from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from duplex.actors import Actor, ActorContext


@dataclass(frozen=True)
class Ping:
    value: Any = None


@dataclass(frozen=True)
class Crash:
    reason: str = "boom"


@dataclass(frozen=True)
class Stop:
    pass


@dataclass
class Journal:
    """What actors under test report: lifecycle hooks and messages, in order."""

    events: list[tuple[str, ...]] = field(default_factory=list)

    def of(self, name: str) -> list[str]:
        return [e[1] for e in self.events if e[0] == name]


class Recorder(Actor[Any]):
    """Records its lifecycle; replies to Ping with its value; crashes on Crash."""

    def __init__(self, journal: Journal, name: str, fail_start: int = 0):
        self.journal = journal
        self.name = name
        self.fail_start = fail_start

    async def on_start(self, ctx: ActorContext) -> None:
        self.journal.events.append((self.name, "start"))
        if self.journal.of(self.name).count("start") <= self.fail_start:
            raise RuntimeError(f"{self.name} failed to start")

    async def on_restart(self, ctx: ActorContext, exc: BaseException) -> None:
        self.journal.events.append((self.name, f"restart:{exc}"))

    async def on_stop(self, ctx: ActorContext) -> None:
        self.journal.events.append((self.name, "stop"))

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        match message:
            case Ping(value):
                return value
            case Crash(reason):
                raise RuntimeError(reason)
            case Stop():
                ctx.stop()
        return None
