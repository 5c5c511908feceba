"""OTP-style supervision on a trio nursery.

Each child incarnation is a task in the supervisor's nursery. A crash does not
cancel the nursery: the task reports the exit to the supervisor's loop, which
applies the strategy, counts the restart against the intensity window and,
past it, stops every child and raises ``RestartIntensityExceeded`` so that the
failure reaches the parent.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, final

import trio

from duplex.exceptions import ActorStopped, RestartIntensityExceeded

from ._actor import Actor
from ._cell import Cell, SystemHooks
from ._mailbox import LaneSpec
from ._ref import ActorRef
from ._spec import Restart, Strategy, SupervisorSpec


def unwrap(exc: BaseException) -> BaseException:
    """The single leaf of nested one-exception groups (trio nurseries are strict)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@dataclass(eq=False)
class _Child:
    cell: Cell
    restart: Restart
    shutdown_timeout: float
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    running: bool = False
    stopping: bool = False
    starting: bool = False
    """Its first start is under way (outside the lock); restarts leave it alone."""


@dataclass(frozen=True, slots=True)
class _Exit:
    child: _Child
    exc: BaseException | None


@final
class Supervisor:
    """Supervises children under one ``SupervisorSpec``; runs inside its owner's nursery."""

    def __init__(self, spec: SupervisorSpec, *, path: str, hooks: SystemHooks):
        self.spec = spec
        self.path = path
        self._hooks = hooks
        self._children: list[_Child] = []
        self._restarts: deque[float] = deque()
        self._exits_send, self._exits_recv = trio.open_memory_channel[_Exit](math.inf)
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._names = itertools.count(1)

    def refs(self) -> list[ActorRef[Any]]:
        """Live children in start order."""
        return [c.cell.ref for c in self._children]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            async for exit_ in self._exits_recv:
                async with self._lock:
                    await self._on_exit(exit_.child, exit_.exc)
                del exit_  # else the last exited child (its actor's arguments) stays alive

    async def spawn(
        self,
        actor_cls: type[Actor[Any]],
        *args: Any,
        name: str | None = None,
        restart: Restart | None = None,
        shutdown_timeout: float = 5.0,
        lanes: tuple[LaneSpec, ...] | None = None,
    ) -> ActorRef[Any]:
        """Start a child; returns once its ``on_start`` finished.

        Raises:
            ActorStopped: the supervisor is shutting down.
            ValueError: ``name`` is taken by a live sibling.
            Exception: whatever ``on_start`` raised (the child is not kept, as in OTP).
        """
        if shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")
        async with self._lock:
            if self._closing or self._nursery is None:
                raise ActorStopped(f"supervisor {self.path} is not running")
            name = name if name is not None else f"${next(self._names)}"
            if "/" in name or not name:
                raise ValueError(f"invalid actor name {name!r}")
            path = f"{self.path.rstrip('/')}/{name}"
            if any(c.cell.path == path for c in self._children):
                raise ValueError(f"{path} already exists")
            cell = Cell(
                actor_cls,
                args,
                path=path,
                lanes=lanes if lanes is not None else actor_cls.lanes,
                hooks=self._hooks,
            )
            child = _Child(cell, restart or self.spec.default_restart, shutdown_timeout)
            child.starting = True
            self._children.append(child)
        # Started outside the lock: an on_start that spawns a sibling must not deadlock,
        # and one slow on_start must not hold up every other spawn.
        try:
            failure = await self._start(child, None)
        finally:
            child.starting = False
        if failure is not None:
            async with self._lock:
                self._remove(child)
            raise failure
        return cell.ref

    async def stop_child(self, ref: ActorRef[Any]) -> None:
        """Stop one child gracefully and forget it (no restart, whatever its type)."""
        async with self._lock:
            for child in self._children:
                if child.cell.ref is ref or child.cell.path == ref.path:
                    await self._stop(child)
                    self._remove(child)
                    return

    async def shutdown(self) -> None:
        """Stop every child, newest first, then end ``run``.

        Temporary children started one after another (a server's sessions and their
        connections: per-client work that nothing else depends on) stop together: their
        shutdown timeouts run at once, so a thousand stuck sessions take one timeout, not a
        thousand. The others stop one at a time, and a run of temporary children stops
        before the children started before it (what it may use: the engine, the VAD), as
        in OTP.
        """
        async with self._lock:
            self._closing = True
            for group in _stop_groups(reversed(list(self._children))):
                async with trio.open_nursery() as nursery:
                    for child in group:
                        nursery.start_soon(self._stop, child)
                for child in group:
                    self._remove(child)
            self._exits_send.close()

    async def _start(self, child: _Child, exc: BaseException | None) -> BaseException | None:
        """Start one incarnation; returns what its start hooks raised, if anything."""
        assert self._nursery is not None
        child.scope, child.done = trio.CancelScope(), trio.Event()
        child.stopping = False
        try:
            await self._nursery.start(self._incarnation, child, exc)
        except Exception as failure:  # a crash in on_start/on_restart, handed to the caller
            return unwrap(failure)
        return None

    async def _incarnation(
        self,
        child: _Child,
        restart_exc: BaseException | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        cell = child.cell
        exit_exc: BaseException | None = None
        child.running = True
        try:
            with child.scope:
                try:
                    await cell.run(restart_exc, task_status)
                except* Exception as group:
                    if not cell.started:
                        raise
                    exit_exc = unwrap(group)
        finally:
            child.running = False
            child.done.set()
        if child.stopping:
            if exit_exc is not None:
                cell.log.error("actor failed while stopping", exc_info=exit_exc)
            return
        self._exits_send.send_nowait(_Exit(child, exit_exc))

    async def _stop(self, child: _Child) -> None:
        """Graceful stop within the child's shutdown timeout, then cancellation."""
        if not child.running:
            return
        child.stopping = True
        child.cell.request_stop()
        with trio.move_on_after(child.shutdown_timeout):
            await child.done.wait()
        if not child.done.is_set():
            child.cell.log.warning("shutdown timeout; cancelling", timeout=child.shutdown_timeout)
            child.scope.cancel()
            await child.done.wait()

    def _remove(self, child: _Child) -> None:
        if child in self._children:
            self._children.remove(child)
            child.cell.close()

    def _count_restart(self) -> int:
        now = trio.current_time()
        while self._restarts and self._restarts[0] <= now - self.spec.period:
            self._restarts.popleft()
        self._restarts.append(now)
        return len(self._restarts)

    async def _on_exit(self, child: _Child, exc: BaseException | None) -> None:
        if child not in self._children or self._closing:
            return
        if exc is not None:
            child.cell.log.error("actor crashed", exc_info=exc)
        again = child.restart is Restart.PERMANENT or (
            child.restart is Restart.TRANSIENT and exc is not None
        )
        if not again:
            self._remove(child)
            return
        n = self._count_restart()
        if n > self.spec.max_restarts:
            self._closing = True
            for other in reversed(list(self._children)):
                await self._stop(other)
                self._remove(other)
            self._exits_send.close()
            raise RestartIntensityExceeded(
                f"{self.path}: {n} restarts within {self.spec.period} s "
                f"(max {self.spec.max_restarts}); last failure in {child.cell.path}"
            ) from exc
        index = self._children.index(child)
        if self.spec.strategy is Strategy.ONE_FOR_ONE:
            group = [child]
        elif self.spec.strategy is Strategy.ONE_FOR_ALL:
            group = list(self._children)
        else:
            group = self._children[index:]
        group = [member for member in group if not member.starting]
        for other in reversed(group):
            await self._stop(other)
        if self.spec.backoff is not None:
            await trio.sleep(self.spec.backoff.delay(n))
        for member in group:
            if member not in self._children:
                continue
            failure = await self._start(member, exc if member is child else None)
            if failure is not None:
                self._exits_send.send_nowait(_Exit(member, failure))
                break
            self._hooks.restarted(member.cell)


def _stop_groups(children: Iterable[_Child]) -> list[list[_Child]]:
    """``children``, in order, cut into what stops together: each run of temporary
    children, and every other child alone."""
    groups: list[list[_Child]] = []
    for child in children:
        temporary = child.restart is Restart.TEMPORARY
        if temporary and groups and groups[-1][0].restart is Restart.TEMPORARY:
            groups[-1].append(child)
        else:
            groups.append([child])
    return groups
