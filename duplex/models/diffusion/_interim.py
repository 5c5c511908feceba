"""A stand-in for ``duplex.models._requests.RequestEngine`` until it lands on main.

It has the same surface (``submit``, ``run``, ``statistics``) and errors, runs one
request at a time on a worker thread, and bounds its queue. Delete this module (and
use the real engine, which also leaves realtime ticks their slack) when it lands.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, final

import trio

from duplex.exceptions import ModelError

Req = TypeVar("Req")
Res = TypeVar("Res")


class RequestCancelled(ModelError):
    """Every request of the running batch was withdrawn: the runner stops at its next unit."""


class RequestsOverloaded(ModelError):
    """The engine's queue is full: answer 429 with ``Retry-After``."""

    retry_after_s = 1


class RequestFailed(ModelError):
    """The runner raised for this request's batch (the cause is chained)."""


class Runner(Protocol[Req, Res]):
    name: str
    max_batch: int

    def run_batch(self, requests: Any, gate: Any) -> list[Res]: ...


@final
@dataclass(frozen=True, slots=True)
class RequestEngineStatistics:
    submitted: int
    refused: int
    cancelled: int
    completed: int
    failed: int
    queued: int
    running: int
    units: int


@final
class _Pending(Generic[Req, Res]):
    __slots__ = ("done", "error", "request", "result", "withdrawn")

    def __init__(self, request: Req) -> None:
        self.request = request
        self.done = trio.Event()
        self.result: Res | None = None
        self.error: BaseException | None = None
        self.withdrawn = False


@final
class _Gate:
    """Counts units; raises `RequestCancelled` once the request is withdrawn."""

    def __init__(self, pending: _Pending[Any, Any], engine: RequestEngine[Any, Any]) -> None:
        self.pending = pending
        self.engine = engine

    def next_unit(self) -> None:
        if self.pending.withdrawn:
            raise RequestCancelled("the request was withdrawn")
        self.engine._units += 1


@final
class RequestEngine(Generic[Req, Res]):
    """Queue requests for ``runner``; one runs at a time, off the event loop."""

    def __init__(self, runner: Runner[Req, Res], *, max_queue: int = 64) -> None:
        self.runner = runner
        self.max_queue = max_queue
        self._queue: deque[_Pending[Req, Res]] = deque()
        self._wake = trio.Event()
        self._running: _Pending[Req, Res] | None = None
        self._submitted = self._refused = self._cancelled = 0
        self._completed = self._failed = self._units = 0

    async def submit(self, request: Req) -> Res:
        """Queue, wait, return the result.

        Raises:
            RequestsOverloaded: the queue is full.
            RequestFailed: the runner raised.
        """
        await trio.lowlevel.checkpoint()
        if len(self._queue) >= self.max_queue:
            self._refused += 1
            raise RequestsOverloaded(f"{self.runner.name}: {len(self._queue)} requests queued")
        pending: _Pending[Req, Res] = _Pending(request)
        self._queue.append(pending)
        self._submitted += 1
        self._wake.set()
        try:
            await pending.done.wait()
        except trio.Cancelled:
            pending.withdrawn = True
            if pending in self._queue:
                self._queue.remove(pending)
            self._cancelled += 1
            raise
        if pending.error is not None:
            raise RequestFailed(f"{self.runner.name}: {pending.error}") from pending.error
        assert pending.result is not None
        return pending.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The loop (in a nursery): the oldest request, on a worker thread, one at a time."""
        task_status.started()
        while True:
            if not self._queue:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            pending = self._queue.popleft()
            self._running = pending
            try:
                gate = _Gate(pending, self)
                (pending.result,) = await trio.to_thread.run_sync(
                    self.runner.run_batch, [pending.request], gate, abandon_on_cancel=True
                )
                self._completed += 1
            except RequestCancelled:
                pass
            except trio.Cancelled:
                pending.withdrawn = True  # the abandoned thread stops at its next unit
                raise
            except Exception as exc:  # the request fails, the engine goes on
                self._failed += 1
                pending.error = exc
            finally:
                self._running = None
            pending.done.set()

    def statistics(self) -> RequestEngineStatistics:
        return RequestEngineStatistics(
            submitted=self._submitted,
            refused=self._refused,
            cancelled=self._cancelled,
            completed=self._completed,
            failed=self._failed,
            queued=len(self._queue),
            running=int(self._running is not None),
            units=self._units,
        )
