"""Handles to actors: ``ActorRef`` for sending, ``Envelope`` and ``Reply`` for asks.

A ref stays valid across restarts: it points at the mailbox, which the
supervisor keeps while it replaces the actor instance behind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, final

import outcome
import trio

from duplex.exceptions import ActorStopped, AskTimeout

from ._mailbox import Mailbox, MailboxStatistics

M = TypeVar("M")


class RuntimeHooks(Protocol):
    """What refs and mailboxes report to the actor system."""

    def dead_letter(self, path: str, message: object, reason: str) -> None: ...

    def late_reply(self, path: str, message: object) -> None: ...


@final
class Reply:
    """One-shot reply slot of an ``ask``; a reply after the asker gave up is counted."""

    __slots__ = ("_abandoned", "_event", "_hooks", "_message", "_outcome", "_path")

    def __init__(self, path: str, message: object, hooks: RuntimeHooks):
        self._event = trio.Event()
        self._outcome: outcome.Outcome[Any] | None = None
        self._abandoned = False
        self._path = path
        self._message = message
        self._hooks = hooks

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def _settle(self, result: outcome.Outcome[Any]) -> None:
        if self._outcome is not None:
            raise RuntimeError("reply already sent")
        self._outcome = result
        if self._abandoned:
            self._hooks.late_reply(self._path, self._message)
        self._event.set()

    def send(self, value: object) -> None:
        """Answer the ask with ``value``."""
        self._settle(outcome.Value(value))

    def fail(self, exc: BaseException) -> None:
        """Answer the ask by raising ``exc`` in the asker."""
        self._settle(outcome.Error(exc))

    async def wait(self, timeout: float) -> Any:
        with trio.move_on_after(timeout):
            await self._event.wait()
        if self._outcome is None:
            self._abandoned = True
            raise AskTimeout(f"{self._path} did not reply within {timeout} s")
        return self._outcome.unwrap()


@final
@dataclass(slots=True, eq=False)
class Envelope:
    """A message in a mailbox, with the reply slot when it was asked."""

    message: object
    reply: Reply | None = None


@final
class ActorRef(Generic[M]):
    """Send messages to an actor; cheap to copy and share.

    ``tell`` waits only when the message's lane is full with the ``block``
    policy; ``tell_nowait`` raises ``trio.WouldBlock`` instead. Messages to a
    stopped actor go to dead letters (counted).
    """

    __slots__ = ("_hooks", "_mailbox", "_route", "path")

    def __init__(
        self,
        path: str,
        mailbox: Mailbox[Envelope],
        route: Callable[[Any], str],
        hooks: RuntimeHooks,
    ):
        self.path = path
        self._mailbox = mailbox
        self._route = route
        self._hooks = hooks

    def __repr__(self) -> str:
        return f"ActorRef({self.path!r})"

    @property
    def alive(self) -> bool:
        return not self._mailbox.closed

    async def wait_stopped(self) -> None:
        """Wait until the actor has stopped for good (its mailbox is closed)."""
        await self._mailbox.wait_closed()

    def statistics(self) -> MailboxStatistics:
        """The target mailbox's per-lane counts (queued, peak, drops)."""
        return self._mailbox.statistics()

    async def tell(self, message: M) -> None:
        """Deliver ``message``; waits for room on a full ``block`` lane.

        Raises:
            MailboxFull: the lane's policy is ``reject`` and it is full.
        """
        try:
            await self._mailbox.put(self._route(message), Envelope(message))
        except ActorStopped:
            self._hooks.dead_letter(self.path, message, "stopped")

    async def tell_eager(self, message: M) -> None:
        """`tell` for the per-frame path: with room on the lane it delivers at once,
        without trio's scheduling round trip (no checkpoint); only a full ``block``
        lane makes it wait, as `tell` does.

        Raises:
            MailboxFull: the lane's policy is ``reject`` and it is full.
        """
        try:
            self.tell_nowait(message)
        except trio.WouldBlock:
            await self.tell(message)

    def tell_nowait(self, message: M) -> None:
        """Deliver ``message`` now or raise.

        Raises:
            trio.WouldBlock: a ``block`` lane is full.
            MailboxFull: a ``reject`` lane is full.
        """
        try:
            self._mailbox.put_nowait(self._route(message), Envelope(message))
        except ActorStopped:
            self._hooks.dead_letter(self.path, message, "stopped")

    async def ask(self, message: M, *, timeout: float = math.inf) -> Any:
        """Send ``message`` and wait for the actor's reply.

        Raises:
            AskTimeout: no reply within ``timeout`` seconds (a late reply is counted).
            ActorStopped: the actor is stopped, or stopped before replying.
            MailboxFull: the lane rejected the message.
        """
        reply = Reply(self.path, message, self._hooks)
        queued = False
        with trio.move_on_after(timeout):
            await self._mailbox.put(self._route(message), Envelope(message, reply))
            queued = True
            await reply._event.wait()
        if reply._outcome is not None:
            return reply._outcome.unwrap()
        if not queued:
            raise AskTimeout(f"{self.path} did not accept the ask within {timeout} s")
        reply._abandoned = True
        raise AskTimeout(f"{self.path} did not reply within {timeout} s")
