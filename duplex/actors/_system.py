"""The actor system: root nursery and supervisor, registry, dead letters, metrics."""

from __future__ import annotations

import signal
from collections import Counter as _Tally
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, final

import trio

from duplex.logs import get_logger
from duplex.metrics import REGISTRY, MetricsRegistry, Sample

from ._actor import Actor
from ._cell import Cell
from ._mailbox import LaneSpec
from ._ref import ActorRef
from ._spec import Restart, SupervisorSpec
from ._supervisor import Supervisor


@final
@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that reached no actor."""

    path: str
    message: object
    reason: str


@final
class ActorSystem:
    """Owns the root supervisor (``/user``) and everything the runtime reports.

    Build it with ``open_actor_system``; the context manager's exit is an
    ordered shutdown of every actor, children before parents.
    """

    def __init__(
        self,
        *,
        name: str,
        registry: MetricsRegistry,
        root: SupervisorSpec,
        dead_letter_capacity: int,
    ):
        self.name = name
        self.metrics = registry
        self.log = get_logger(system=name)
        self.dead_letters: deque[DeadLetter] = deque(maxlen=dead_letter_capacity)
        self._cells: dict[str, Cell] = {}
        self._root = Supervisor(root, path="/user", hooks=self)
        self._shutdown = trio.Event()
        self._dead = registry.counter(
            "duplex_dead_letters_total", "Messages that reached no actor", ["reason"]
        )
        self._dropped = registry.counter(
            "duplex_mailbox_dropped_total",
            "Messages dropped by a mailbox lane's overflow policy",
            ["actor", "lane", "reason"],
        )
        self._late = registry.counter(
            "duplex_ask_late_replies_total",
            "Replies that arrived after the ask timed out",
            ["actor"],
        )
        self._restarts = registry.counter(
            "duplex_actor_restarts_total", "Actor restarts by supervisors", ["actor"]
        )
        registry.add_collector(
            "duplex_mailbox_queued", "gauge", "Messages queued, by actor class and lane",
            self._collect_queued,
        )  # fmt: skip
        registry.add_collector(
            "duplex_actors", "gauge", "Live actors, by class", self._collect_live
        )

    # -- public API -------------------------------------------------------

    async def spawn(
        self,
        actor_cls: type[Actor[Any]],
        *args: Any,
        name: str | None = None,
        restart: Restart | None = None,
        shutdown_timeout: float = 5.0,
        lanes: tuple[LaneSpec, ...] | None = None,
    ) -> ActorRef[Any]:
        """Start a top-level actor under ``/user``; returns after its ``on_start``."""
        return await self._root.spawn(
            actor_cls,
            *args,
            name=name,
            restart=restart,
            shutdown_timeout=shutdown_timeout,
            lanes=lanes,
        )

    async def stop(self, ref: ActorRef[Any]) -> None:
        """Stop a top-level actor gracefully."""
        await self._root.stop_child(ref)

    def lookup(self, path: str) -> ActorRef[Any] | None:
        """The live actor at ``path`` (``/user/a/b``) or at top-level name ``a``."""
        cell = self._cells.get(path if path.startswith("/") else f"/user/{path}")
        return cell.ref if cell is not None else None

    def paths(self) -> list[str]:
        return sorted(self._cells)

    def request_shutdown(self) -> None:
        """Ask ``run_until_shutdown`` to return (then the context exit shuts down)."""
        self._shutdown.set()

    async def wait_shutdown_requested(self) -> None:
        await self._shutdown.wait()

    # -- SystemHooks --------------------------------------------------------

    def dead_letter(self, path: str, message: object, reason: str) -> None:
        self._dead.inc(reason=reason)
        self.dead_letters.append(DeadLetter(path, message, reason))
        self.log.debug("dead letter", actor=path, reason=reason, message=type(message).__name__)

    def late_reply(self, path: str, message: object) -> None:
        self._late.inc(actor=_class_of(self._cells.get(path)))
        self.log.debug("late reply dropped", actor=path, message=type(message).__name__)

    def dropped(self, cell: Cell, lane: str, reason: str, message: object) -> None:
        self._dropped.inc(actor=cell.actor_cls.__name__, lane=lane, reason=reason)
        self.log.debug(
            "mailbox drop", actor=cell.path, lane=lane, reason=reason,
            message=type(message).__name__,
        )  # fmt: skip

    def registered(self, cell: Cell) -> None:
        self._cells[cell.path] = cell

    def unregistered(self, cell: Cell) -> None:
        if self._cells.get(cell.path) is cell:
            del self._cells[cell.path]

    def restarted(self, cell: Cell) -> None:
        self._restarts.inc(actor=cell.actor_cls.__name__)

    def make_supervisor(self, cell: Cell) -> Supervisor:
        return Supervisor(cell.actor_cls.supervision, path=cell.path, hooks=self)

    # -- internals ----------------------------------------------------------

    def _collect_queued(self) -> list[Sample]:
        totals: _Tally[tuple[str, str]] = _Tally()
        for cell in self._cells.values():
            for lane in cell.mailbox.statistics().lanes:
                totals[(cell.actor_cls.__name__, lane.name)] += lane.queued
        return [
            Sample("duplex_mailbox_queued", {"actor": a, "lane": lane}, n)
            for (a, lane), n in sorted(totals.items())
        ]

    def _collect_live(self) -> list[Sample]:
        totals = _Tally(cell.actor_cls.__name__ for cell in self._cells.values())
        return [Sample("duplex_actors", {"actor": a}, n) for a, n in sorted(totals.items())]


def _class_of(cell: Cell | None) -> str:
    return cell.actor_cls.__name__ if cell is not None else "unknown"


@asynccontextmanager
async def open_actor_system(
    *,
    name: str = "duplex",
    registry: MetricsRegistry | None = None,
    root: SupervisorSpec | None = None,
    dead_letter_capacity: int = 1000,
) -> AsyncIterator[ActorSystem]:
    """Run an actor system for the duration of the block.

    Leaving the block stops every actor in reverse start order (children
    first). A root supervisor that exceeds its restart intensity raises out
    of the block. ``dead_letter_capacity``: how many undelivered messages
    ``dead_letters`` keeps for inspection (tests); each keeps alive everything it
    references, so a long-running server keeps none (every one is still counted).
    """
    system = ActorSystem(
        name=name,
        registry=registry if registry is not None else REGISTRY,
        root=root if root is not None else SupervisorSpec(),
        dead_letter_capacity=dead_letter_capacity,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(system._root.run)
        try:
            yield system
        finally:
            with trio.CancelScope(shield=True):
                await system._root.shutdown()


async def run_until_signal(system: ActorSystem) -> int:
    """Wait for SIGINT/SIGTERM (or ``request_shutdown``); returns the signal number or 0."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            received = 0

            async def on_signal() -> None:
                nonlocal received
                async for signum in signals:
                    received = signum
                    system.log.info("signal received; shutting down", signal=signum)
                    system.request_shutdown()
                    return

            nursery.start_soon(on_signal)
            await system.wait_shutdown_requested()
            nursery.cancel_scope.cancel()
    return received
