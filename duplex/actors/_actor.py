"""The actor contract: typed messages in, hooks around a lifetime, a context to act."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import trio

from ._mailbox import DEFAULT_LANES, LaneSpec
from ._ref import ActorRef, Reply
from ._spec import Restart, SupervisorSpec

if TYPE_CHECKING:
    from ._cell import Cell

M = TypeVar("M")
A = TypeVar("A", bound="Actor[Any]")


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """Base for messages that ride the control lane (never queued behind data)."""


class Actor(Generic[M]):
    """Subclass and implement ``receive``; the runtime owns the task and mailbox.

    Lifetime: ``on_start`` runs before the first message (a crash there fails the
    spawn on first start, or counts as a restart failure later). On a restart
    the supervisor makes a fresh instance and calls ``on_restart(ctx, exc)``
    then ``on_start``. ``on_stop`` runs on a graceful stop, after the actor's
    children have stopped. The mailbox (and so every ``ActorRef``) outlives
    restarts; the message being handled when the actor crashed is not retried.

    ``receive`` returns the reply to an ``ask`` (ignored for ``tell``), unless
    it called ``ctx.defer_reply()`` to answer later.
    """

    lanes: ClassVar[tuple[LaneSpec, ...]] = DEFAULT_LANES
    """Mailbox lanes of this actor class."""

    supervision: ClassVar[SupervisorSpec] = SupervisorSpec()
    """How this actor supervises the children it spawns."""

    @classmethod
    def route(cls, message: object) -> str:
        """The lane a message goes to; called by senders, so it must be cheap."""
        return "control" if isinstance(message, ControlMessage) else "data"

    async def on_start(self, ctx: ActorContext) -> None:
        """Called before the first message."""

    async def on_restart(self, ctx: ActorContext, exc: BaseException) -> None:
        """Called on a fresh instance after the previous one crashed with ``exc``."""

    async def on_stop(self, ctx: ActorContext) -> None:
        """Called on a graceful stop."""

    async def receive(self, ctx: ActorContext, message: M) -> Any:
        raise NotImplementedError


class ActorContext:
    """What an actor may do: know itself, spawn children, set timers, reply, stop."""

    __slots__ = ("_cell", "_current_reply", "_deferred", "_nursery", "_timers")

    def __init__(self, cell: Cell, nursery: trio.Nursery):
        self._cell = cell
        self._nursery = nursery
        self._timers: dict[object, trio.CancelScope] = {}
        self._current_reply: Reply | None = None
        self._deferred = False

    @property
    def self(self) -> ActorRef[Any]:
        return self._cell.ref

    @property
    def path(self) -> str:
        return self._cell.path

    @property
    def log(self) -> Any:
        return self._cell.log

    async def spawn(
        self,
        actor_cls: type[A],
        *args: Any,
        name: str | None = None,
        restart: Restart | None = None,
        shutdown_timeout: float = 5.0,
        lanes: tuple[LaneSpec, ...] | None = None,
    ) -> ActorRef[Any]:
        """Start a child under this actor's supervisor; returns after its ``on_start``."""
        supervisor = await self._cell.children(self._nursery)
        return await supervisor.spawn(
            actor_cls,
            *args,
            name=name,
            restart=restart,
            shutdown_timeout=shutdown_timeout,
            lanes=lanes,
        )

    async def stop_child(self, ref: ActorRef[Any]) -> None:
        """Stop one child gracefully (its shutdown timeout applies) and forget it."""
        supervisor = await self._cell.children(self._nursery)
        await supervisor.stop_child(ref)

    def start_soon(self, fn: Any, *args: Any, name: str | None = None) -> None:
        """Run ``fn(*args)`` beside the message loop, for this incarnation's lifetime.

        The task is cancelled when the actor stops or restarts; if it raises,
        the actor crashes and its supervisor decides (nothing is swallowed).
        Reach the actor's state from it only by telling ``ctx.self``.
        """
        self._nursery.start_soon(
            fn, *args, name=name or f"{self.path}:{getattr(fn, '__name__', fn)}"
        )

    def stop(self) -> None:
        """Stop after the current message: a normal exit, which only a permanent child restarts."""
        self._cell.request_stop()

    def start_timer(self, key: object, delay: float, message: Any, *, repeat: bool = False) -> None:
        """Tell ``message`` to self after ``delay`` s (every ``delay`` s if ``repeat``).

        A timer with the same key is replaced. Timers die with the incarnation.
        """
        if delay < 0 or math.isnan(delay):
            raise ValueError(f"timer delay must be >= 0, got {delay}")
        self.cancel_timer(key)
        scope = trio.CancelScope()
        self._timers[key] = scope
        self._nursery.start_soon(self._run_timer, key, scope, delay, message, repeat)

    def cancel_timer(self, key: object) -> bool:
        scope = self._timers.pop(key, None)
        if scope is None:
            return False
        scope.cancel()
        return True

    async def _run_timer(
        self, key: object, scope: trio.CancelScope, delay: float, message: Any, repeat: bool
    ) -> None:
        deadline = trio.current_time() + delay
        with scope:
            while True:
                await trio.sleep_until(deadline)
                await self._cell.ref.tell(message)
                if not repeat:
                    break
                deadline += delay
        if self._timers.get(key) is scope:
            del self._timers[key]

    def defer_reply(self) -> Reply:
        """Take the current ask's reply slot to answer later (``receive``'s result is then ignored).

        Raises:
            RuntimeError: the current message was a ``tell``.
        """
        if self._current_reply is None:
            raise RuntimeError("the current message was not asked; nothing to reply to")
        self._deferred = True
        return self._current_reply
