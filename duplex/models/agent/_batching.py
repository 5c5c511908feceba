"""A stand-in for the request engine (``duplex.models._requests``, landing on main): queue
requests, run them in batches off the trio thread, hand each its result.

Only the shape the agent's stages need (``submit``, ``run``, ``statistics``); it goes
when the shared ``RequestEngine`` lands, and the runners stay as they are (they are
``BatchRunner`` s already: ``name``, ``max_batch``, ``run_batch(requests, gate)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, final

import trio

from duplex.exceptions import ModelError

__all__ = ["NO_GATE", "BatchEngine", "BatchRunner", "BatchStatistics", "UnitGate"]

Req = TypeVar("Req")
Res = TypeVar("Res")


class UnitGate(Protocol):
    """Called by a runner between units of work (a no-op while nothing realtime shares it)."""

    def next_unit(self) -> None: ...


class _NoGate:
    def next_unit(self) -> None:
        return None


NO_GATE: UnitGate = _NoGate()


class BatchRunner(Protocol[Req, Res]):
    """Runs a batch of requests off the trio thread; one result per request, in order."""

    name: str
    max_batch: int

    def run_batch(self, requests: Sequence[Req], gate: UnitGate) -> list[Res]: ...


@final
@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """Counters of one engine."""

    submitted: int
    refused: int
    cancelled: int
    batches: int
    largest_batch: int


@dataclass(eq=False)
class _Pending(Generic[Req, Res]):
    request: Req
    done: trio.Event = field(default_factory=trio.Event)
    result: Res | None = None
    error: BaseException | None = None
    withdrawn: bool = False


class BatchEngine(Generic[Req, Res]):
    """One runner shared by every session of the process.

    Args:
        runner: the batch runner.
        max_queue: requests that may wait; beyond it `submit` raises `ModelError`.
    """

    def __init__(self, runner: BatchRunner[Req, Res], *, max_queue: int = 256) -> None:
        self.runner = runner
        self._send, self._recv = trio.open_memory_channel[_Pending[Req, Res]](max_queue)
        self._counts = dict.fromkeys(("submitted", "refused", "cancelled", "batches"), 0)
        self._largest = 0

    async def submit(self, request: Req) -> Res:
        """Queue ``request`` and wait for its result; cancelling withdraws it.

        Raises:
            ModelError: the queue is full, or the runner failed (the cause chained).
        """
        pending: _Pending[Req, Res] = _Pending(request)
        try:
            self._send.send_nowait(pending)
        except trio.WouldBlock:
            self._counts["refused"] += 1
            raise ModelError(f"the {self.runner.name} queue is full") from None
        self._counts["submitted"] += 1
        try:
            await pending.done.wait()
        except BaseException:
            if not pending.done.is_set():
                pending.withdrawn = True
                self._counts["cancelled"] += 1
            raise
        if pending.error is not None:
            raise ModelError(f"the {self.runner.name} runner failed") from pending.error
        return pending.result  # type: ignore[return-value]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The loop: take what waits (up to ``max_batch``), run it in a thread, answer."""
        task_status.started()
        async for first in self._recv:
            batch = [first]
            while len(batch) < self.runner.max_batch:
                try:
                    batch.append(self._recv.receive_nowait())
                except trio.WouldBlock:
                    break
            batch = [p for p in batch if not p.withdrawn]
            if not batch:
                continue
            self._counts["batches"] += 1
            self._largest = max(self._largest, len(batch))
            requests = [p.request for p in batch]
            try:
                results = await trio.to_thread.run_sync(
                    self.runner.run_batch, requests, NO_GATE, abandon_on_cancel=False
                )
            except Exception as exc:  # the batch fails; each request learns why
                for p in batch:
                    p.error = exc
                    p.done.set()
                continue
            for p, result in zip(batch, results, strict=True):
                p.result = result
                p.done.set()

    def statistics(self) -> BatchStatistics:
        return BatchStatistics(**self._counts, largest_batch=self._largest)
