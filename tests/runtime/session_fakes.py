"""What a session actor talks to, standing in for a connection actor and the hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from duplex.actors import Actor, ActorContext


class Socket(Actor[Any]):
    """Stands for a connection actor: records what the session tells it."""

    def __init__(self, told: list[object]) -> None:
        self.told = told

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        self.told.append(message)
        return None


@dataclass
class Hub:
    """Stands for the hub: the sessions it was told are released, the sockets let go."""

    released_ids: list[str] = field(default_factory=list)
    let_go_ids: list[str] = field(default_factory=list)

    def released(self, session_id: str) -> None:
        self.released_ids.append(session_id)

    def let_go(self, session_id: str) -> None:
        self.let_go_ids.append(session_id)
