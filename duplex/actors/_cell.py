"""A cell is one supervised child: its mailbox and ref persist, incarnations come and go."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

from duplex.exceptions import ActorStopped, MailboxFull
from duplex.logs import get_logger

from ._actor import Actor, ActorContext
from ._mailbox import Interrupted, LaneSpec, Mailbox
from ._ref import ActorRef, Envelope, RuntimeHooks

if TYPE_CHECKING:
    from ._supervisor import Supervisor


class SystemHooks(RuntimeHooks, Protocol):
    """Everything a cell reports to its actor system (metrics, registry, logs)."""

    def dropped(self, cell: Cell, lane: str, reason: str, message: object) -> None: ...

    def registered(self, cell: Cell) -> None: ...

    def unregistered(self, cell: Cell) -> None: ...

    def restarted(self, cell: Cell) -> None: ...

    def make_supervisor(self, cell: Cell) -> Supervisor: ...


class Cell:
    """Runs incarnations of one actor class; owns the mailbox across restarts."""

    def __init__(
        self,
        actor_cls: type[Actor[Any]],
        args: tuple[Any, ...],
        *,
        path: str,
        lanes: tuple[LaneSpec, ...],
        hooks: SystemHooks,
    ):
        self.actor_cls = actor_cls
        self.args = args
        self.path = path
        self.hooks = hooks
        self.mailbox: Mailbox[Envelope] = Mailbox(lanes, on_drop=self._on_drop)
        self.ref: ActorRef[Any] = ActorRef(path, self.mailbox, actor_cls.route, hooks)
        self.log = get_logger(actor=path)
        self.started = False
        self._stop_requested = False
        self._children: Supervisor | None = None
        hooks.registered(self)

    def _on_drop(self, lane: str, reason: str, envelope: Envelope) -> None:
        self.hooks.dropped(self, lane, reason, envelope.message)
        if envelope.reply is not None and not envelope.reply.done:
            envelope.reply.fail(
                MailboxFull(f"{self.path}: ask dropped from lane {lane} ({reason})")
            )

    async def children(self, nursery: trio.Nursery) -> Supervisor:
        """This incarnation's supervisor for its children, started on first use."""
        if self._children is None:
            supervisor = self.hooks.make_supervisor(self)
            await nursery.start(supervisor.run)
            self._children = supervisor
        return self._children

    def request_stop(self) -> None:
        """Finish the current message, then stop; the supervisor decides what follows."""
        self._stop_requested = True
        self.mailbox.interrupt()

    async def run(
        self,
        restart_exc: BaseException | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One incarnation: start hooks, the message loop, ordered shutdown."""
        self.started = False
        self._stop_requested = False
        self._children = None
        actor = self.actor_cls(*self.args)
        async with trio.open_nursery() as nursery:
            ctx = ActorContext(self, nursery)
            try:
                if restart_exc is not None:
                    await actor.on_restart(ctx, restart_exc)
                await actor.on_start(ctx)
                self.started = True
                task_status.started()
                await self._loop(actor, ctx)
                await self._stop_children()
                await actor.on_stop(ctx)
            finally:
                await self._stop_children()
                nursery.cancel_scope.cancel()

    async def _stop_children(self) -> None:
        if self._children is not None:
            children, self._children = self._children, None
            await children.shutdown()

    async def _loop(self, actor: Actor[Any], ctx: ActorContext) -> None:
        mailbox = self.mailbox
        while not self._stop_requested:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                envelope = mailbox.get_nowait()
            except trio.WouldBlock:
                envelope = await self._wait_for_message()
                if envelope is None:
                    continue
            except trio.EndOfChannel:
                return
            else:
                # a schedule point that cannot lose the message we just took
                await trio.lowlevel.cancel_shielded_checkpoint()
            reply = envelope.reply
            ctx._current_reply, ctx._deferred = reply, False
            try:
                result = await actor.receive(ctx, envelope.message)
            except Exception as exc:
                if reply is not None and not reply.done:
                    reply.fail(exc)
                raise
            finally:
                ctx._current_reply = None
            if reply is not None and not ctx._deferred and not reply.done:
                reply.send(result)

    async def _wait_for_message(self) -> Envelope | None:
        """Park until a message arrives; a stop request interrupts the wait (returns None)."""
        try:
            return await self.mailbox.get()
        except Interrupted:
            return None
        except trio.EndOfChannel:
            self._stop_requested = True
            return None

    def close(self) -> None:
        """Final stop: close the mailbox; what was queued goes to dead letters."""
        for envelope in self.mailbox.close():
            if envelope.reply is not None and not envelope.reply.done:
                envelope.reply.fail(ActorStopped(f"{self.path} stopped before replying"))
            self.hooks.dead_letter(self.path, envelope.message, "stopped")
        self.hooks.unregistered(self)
