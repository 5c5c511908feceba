"""`RequestEngine`: request-batched models (robot policies, TTS, diffusion, ASR) on one core.

The narrow interface is one call: ``await engine.submit(request)`` returns
that request's result or raises `RequestsOverloaded` / `RequestFailed`.
Behind it a `RequestBatcher` decides on numbers when a batch is due
(``_batcher.py``) and `run`, the engine's loop, takes each batch when the
runner is free and calls ``runner.run_batch`` once through ``offload`` (a
worker thread by default). Nothing here knows about sockets or the wire.

Realtime first: with a `Slack` (the process's realtime tick driver shares
it), each unit of preemption waits for a window between ticks. The first
unit of a batch is acquired before the call; a runner whose work has several
units (diffusion steps, TTS sentences) calls ``gate.next_unit()`` between
them from its thread. A batch whose requests have all been withdrawn stops
at its next unit (`RequestCancelled`), so a client that leaves frees the
engine within one unit.

Two priority classes share one engine (`Priority`): a live session's requests
(``REALTIME``: the voice agent's sentences and speech recognition) and the rest
(``BATCH``: HTTP speech, images, robots). The realtime FIFO is taken first, and
its batches run at once, ungated (they are a realtime path themselves, and a unit
longer than a tick would never fit a window); batch-class batches run unit by unit
in the slack. A batch-class batch waiting for its first window gives way to
realtime requests that arrive meanwhile; one already running is not interrupted
(its runner is mid-call), so a realtime request waits at most for the batch it
finds running.

A request whose client leaves while it waits is withdrawn; one whose batch
is already running finishes and its result is dropped (counted as orphaned).
A runner that raises fails only its batch: each request in it gets
`RequestFailed` with the cause chained, and the loop goes on. A runner may
also return an ``Exception`` instance for one request, which fails alone.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Generic, Protocol, TypeVar, final, runtime_checkable

import trio

from duplex.exceptions import RequestCancelled, RequestFailed, RequestsOverloaded

from ._batcher import BatcherStatistics, Priority, RequestBatcher
from ._driver import Offload
from ._slack import Slack, UnitEstimate

__all__ = [
    "REQUEST_METRICS",
    "BatchRunner",
    "Completed",
    "RequestEngine",
    "RequestEngineStatistics",
    "UnitGate",
]

Req = TypeVar("Req")
Res = TypeVar("Res")
Req_contra = TypeVar("Req_contra", contravariant=True)
Res_co = TypeVar("Res_co", covariant=True)

DEFAULT_MAX_QUEUE: Final = 1024


class UnitGate(Protocol):
    """What a runner's thread calls between its units of preemption."""

    until: float
    """When the running unit's window closes (``time.perf_counter`` seconds; ``inf``: no
    realtime work to make way for): the slack's margin before the next tick, or for a
    runner with ``elastic_unit_s`` that much, taken off. Such a runner ends its unit at
    its first boundary past it."""

    def next_unit(self, kind: str = "step") -> None:
        """Block until there is slack for another unit; ``kind``: what that unit is. Each
        kind has its own cost estimate, so a unit unlike the rest (an image's final VAE
        decode after its denoising steps) waits for a window its own cost fits.

        Raises:
            RequestCancelled: every request of the batch was withdrawn; let it propagate.
        """
        ...

    def check(self) -> None:
        """Return at once, or raise if the batch should stop now: a runner whose unit is long
        (a diffusion step at a large size) calls it inside the unit (from its model's module
        hooks), so a withdrawn batch or a stopping engine ends within a module's forward,
        not at the unit's end. Never waits.

        Raises:
            RequestCancelled: every request was withdrawn, or the engine is stopping.
        """
        ...


@runtime_checkable
class ClosableRunner(Protocol):
    """A runner with resources beyond its memory (child processes) to give back when its
    engine's loop ends."""

    def close(self) -> None: ...


class BatchRunner(Protocol[Req_contra, Res_co]):
    """A model served by request batches.

    ``name`` labels its metrics; ``max_batch`` is the most requests one call
    takes; an optional ``metadata`` mapping is what clients are told about it;
    an optional ``beside_realtime`` (true) says its units run on a device stream
    below the realtime one, so any window will do, not only one they fit
    (`Slack.acquire`); an optional ``elastic_unit_s`` (seconds) says its work can
    stop at a boundary at least that often (espeak-ng's audio blocks), so a unit
    needs a window of only that much and runs until that much before the next tick
    (`UnitGate.until`), whatever its past units took: no other margin is kept.
    ``run_batch`` blocks (it runs off the trio thread) and returns one result
    per request, in order; an ``Exception`` instance as a result fails that
    request alone, and raising fails the whole batch. Requests and results
    cross process boundaries (engine processes) as pickles.
    """

    @property
    def name(self) -> str: ...

    @property
    def max_batch(self) -> int: ...

    def run_batch(
        self, requests: Sequence[Req_contra], gate: UnitGate, /
    ) -> Sequence[Res_co | Exception]: ...


@final
@dataclass(frozen=True, slots=True)
class Completed(Generic[Res]):
    """One request's result, with what its batch cost.

    Args:
        result: what the runner returned for it.
        run_ms: the runner call's time for the whole batch it ran in.
        batch_size: how many requests that batch held.
    """

    result: Res = field(repr=False)
    run_ms: float
    batch_size: int


@final
@dataclass(frozen=True, slots=True)
class RequestEngineStatistics:
    """The engine's counters, with its batcher's.

    Args:
        failed_batches: runner calls that raised or broke the contract.
        failed_requests: requests answered with `RequestFailed`.
        orphaned: results dropped because their client had left.
        stopped_batches: batches stopped at a unit because all their clients had left.
        last_run_ms: the latest runner call's time (``None`` before the first).
        batcher: the queue's record.
    """

    failed_batches: int
    failed_requests: int
    orphaned: int
    stopped_batches: int
    last_run_ms: float | None
    batcher: BatcherStatistics

    def metric(self, name: str) -> float | None:
        """The value of `REQUEST_METRICS` entry ``name``."""
        batcher = self.batcher
        values: dict[str, float | None] = {
            "duplex_requests_total": batcher.submitted,
            "duplex_request_batches_total": batcher.batches,
            "duplex_requests_batched_total": batcher.batched,
            "duplex_request_largest_batch": batcher.largest_batch,
            "duplex_requests_queued": batcher.queued,
            "duplex_requests_refused_total": batcher.refused,
            "duplex_requests_cancelled_total": batcher.cancelled,
            "duplex_requests_failed_total": self.failed_requests,
            "duplex_requests_orphaned_total": self.orphaned,
            "duplex_request_batches_stopped_total": self.stopped_batches,
            "duplex_request_last_run_seconds": (
                None if self.last_run_ms is None else self.last_run_ms / 1000.0
            ),
        }
        return values[name]


REQUEST_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_requests_total", "counter", "Requests queued"),
    ("duplex_request_batches_total", "counter", "Runner calls (batches) run"),
    ("duplex_requests_batched_total", "counter", "Requests run in batches"),
    ("duplex_request_largest_batch", "gauge", "The largest batch run so far"),
    ("duplex_requests_queued", "gauge", "Requests waiting for the runner now"),
    ("duplex_requests_refused_total", "counter", "Requests refused: the queue was full"),
    ("duplex_requests_cancelled_total", "counter", "Requests withdrawn: their client left"),
    ("duplex_requests_failed_total", "counter", "Requests whose run failed"),
    ("duplex_requests_orphaned_total", "counter", "Results dropped: their client had left"),
    ("duplex_request_batches_stopped_total", "counter", "Batches stopped: every client left"),
    ("duplex_request_last_run_seconds", "gauge", "The latest runner call's time"),
)
"""A request engine's metrics (name, kind, help), read from `RequestEngineStatistics.metric`,
labelled ``runner`` by whoever exports them."""


@dataclass(slots=True, eq=False)
class _Waiting(Generic[Req, Res]):
    request: Req
    priority: Priority = Priority.BATCH
    done: trio.Event = field(default_factory=trio.Event)
    reply: Completed[Res] | None = None
    error: RequestFailed | None = None
    gone: bool = False


@final
class _Gate:
    """The `UnitGate` of one running batch: units after the first wait for slack.

    Only a runner in a worker thread can wait; one run on the event loop itself
    (an ``inline`` offload in tests) has its units checked for withdrawal only.
    """

    def __init__(
        self,
        batch: Sequence[_Waiting[object, object]],
        slack: Slack | None,
        estimates: Callable[[str], UnitEstimate],
        costs: Callable[[str], UnitEstimate | float],
        timer: Callable[[], float],
        beside: bool = False,
        elastic_s: float | None = None,
    ) -> None:
        self._batch = batch
        self._slack = slack
        self._beside = beside
        self._elastic_s = elastic_s
        self._estimates = estimates
        self._costs = costs
        self._timer = timer
        self.holding = False
        self.unit_started = timer()
        self.until = math.inf
        self.kind = "step"
        """The running unit's kind (a batch's first unit is a ``step``)."""
        self.stopping = False
        """The engine's loop was cancelled (shutdown) while the runner ran: stop at `check`."""

    def check(self) -> None:
        if self.stopping:
            raise RequestCancelled("the engine is stopping")
        if all(waiting.gone for waiting in self._batch):
            raise RequestCancelled("every request of the batch was withdrawn")

    def next_unit(self, kind: str = "step") -> None:
        self.check()
        now = self._timer()
        self._estimates(self.kind).record(now - self.unit_started)
        self.kind = kind
        cost = self._costs(kind)
        if self._slack is not None and not trio.lowlevel.in_trio_run():
            seconds = cost.seconds if isinstance(cost, UnitEstimate) else cost
            # the window held still fits the next unit: it goes on in it, with no hop to the
            # event loop (a hop costs the loop's and the GIL's latency, each unit; measured
            # on CPU-2 with espeak-ng's sentences). With no realtime work (``until`` is inf)
            # every unit hops, so sessions that start meanwhile get their windows.
            if not (self.holding and self.until != math.inf and now + seconds <= self.until):
                # one hop to the event loop: hand the window back and wait for the next
                trio.from_thread.run(self._next_window, self._slack, cost)
        self.unit_started = self._timer()

    async def _next_window(self, slack: Slack, estimate: UnitEstimate | float) -> None:
        if self.holding:
            self.holding = False
            slack.release(beside_steps=self._beside)
        elastic = self._elastic_s is not None
        await slack.acquire(estimate, beside_steps=self._beside, elastic=elastic)
        self.holding = True
        self.opened(slack)

    def opened(self, slack: Slack) -> None:
        """A window is held for the running unit: when it closes (`UnitGate.until`)."""
        self.until = self._timer() + slack.time_left(self._elastic_s)

    def end(self) -> None:
        """The runner call returned (on the event loop): its last unit's time, and the window
        back."""
        self._estimates(self.kind).record(self._timer() - self.unit_started)
        if self.holding:
            assert self._slack is not None
            self.holding = False
            self._slack.release(beside_steps=self._beside)


@final
class RequestEngine(Generic[Req, Res]):
    """Batches concurrent `submit` calls into ``runner.run_batch`` calls.

    Args:
        runner: the batched model.
        max_wait_s: how long a request waits for others before its batch runs.
        max_queue: the most requests waiting at once; more raise `RequestsOverloaded`.
        slack: the process's realtime windows (``None``: no realtime work shares it), which
            batch-class requests run in.
        offload: how a runner call leaves the trio thread (``None``:
            ``trio.to_thread.run_sync``); tests pass `inline` for ``MockClock``
            (units then are not gated one by one: only the first waits for slack).
        timer: monotonic seconds, used only to measure runner calls and units.
    """

    def __init__(
        self,
        runner: BatchRunner[Req, Res],
        *,
        max_wait_s: float = 0.002,
        max_queue: int = DEFAULT_MAX_QUEUE,
        slack: Slack | None = None,
        offload: Offload | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.runner = runner
        max_batch = runner.max_batch
        self._batcher = RequestBatcher(
            max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max(max_queue, max_batch)
        )
        self._slack = slack
        self._beside: bool = getattr(runner, "beside_realtime", False)
        """Its units run below realtime steps on their device (`Slack.acquire`)."""
        self._elastic_s: float | None = getattr(runner, "elastic_unit_s", None)
        """Its units can end within this much, at the window's close (`UnitGate.until`)."""
        self._offload: Offload = offload or trio.to_thread.run_sync
        self._timer = timer
        self._estimates: dict[str, UnitEstimate] = {}
        self._tickets = itertools.count()
        self._waiting: dict[int, _Waiting[Req, Res]] = {}
        self._submitted = trio.Event()
        self._realtime_submitted = trio.Event()
        self._failed_batches = 0
        self._failed_requests = 0
        self._orphaned = 0
        self._stopped = 0
        self._last_run_ms: float | None = None

    @property
    def name(self) -> str:
        return self.runner.name

    @property
    def metadata(self) -> Mapping[str, Any]:
        """What the runner tells clients about itself (a policy's metadata; ``{}``: nothing)."""
        metadata: Mapping[str, Any] = getattr(self.runner, "metadata", {})
        return metadata

    def retry_after_s(self) -> float:
        """How long the queue now takes to drain, by the latest batch's time (at least 1 s):
        what a refused client is told to wait (``Retry-After``)."""
        batches = -(-len(self._batcher) // self._batcher.max_batch)
        per_batch = (self._last_run_ms or 0.0) / 1000.0
        return max(1.0, batches * per_batch)

    async def submit(self, request: Req, *, priority: Priority = Priority.BATCH) -> Res:
        """Queue ``request`` and wait for its result (see `submit_timed`)."""
        return (await self.submit_timed(request, priority=priority)).result

    async def submit_timed(
        self, request: Req, *, priority: Priority = Priority.BATCH
    ) -> Completed[Res]:
        """Queue ``request`` in its class and wait for its result and its batch's cost.

        Raises:
            RequestsOverloaded: its class's queue is full (the request did not run).
            RequestFailed: the runner raised for its batch, or returned an exception,
                or nothing, for it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        ticket = next(self._tickets)
        if not self._batcher.submit(ticket, trio.current_time(), priority):
            raise RequestsOverloaded(
                f"{self.name}: {self._batcher.max_queue} requests already wait",
                retry_after_s=self.retry_after_s(),
            )
        waiting = self._waiting[ticket] = _Waiting[Req, Res](request, priority)
        self._submitted.set()
        if priority is Priority.REALTIME:
            self._realtime_submitted.set()
        try:
            await waiting.done.wait()
        except BaseException:
            if self._batcher.cancel(ticket):
                del self._waiting[ticket]
            else:  # its batch is running: the result is dropped when it comes
                waiting.gone = True
            raise
        if waiting.error is not None:
            raise waiting.error
        assert waiting.reply is not None
        return waiting.reply

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Forever: wait until a batch is due, run it, hand out its results."""
        task_status.started()
        try:
            while True:
                due = self._batcher.due()
                if due is None or due > trio.current_time():
                    self._submitted = trio.Event()
                    with trio.move_on_at(due if due is not None else float("inf")):
                        await self._submitted.wait()
                    continue
                if self._slack is None or self._batcher.next_class() is Priority.REALTIME:
                    await self._run_batch(self._batcher.take(), gated=False)
                    continue
                if not await self._window_unless_realtime():
                    continue  # realtime work came first; or the batch's clients all left
                tickets = self._batcher.take()
                if not tickets:
                    self._slack.release(beside_steps=self._beside)
                    continue
                await self._run_batch(tickets, gated=True)
        finally:  # stopped or crashed: no request is left waiting on a dead loop
            self._fail_all(f"the {self.name} engine stopped")
            if isinstance(self.runner, ClosableRunner):
                # its child processes (the ASR's pocketsphinx) go with it: a crash's fresh
                # engine starts new ones, and a stopping engine process must not wait on them
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.runner.close)

    async def _window_unless_realtime(self) -> bool:
        """Hold a slack window for the next batch-class batch; ``False`` (no window held):
        a realtime request arrived while it waited, and goes first."""
        assert self._slack is not None
        self._realtime_submitted = trio.Event()
        held = False
        async with trio.open_nursery() as nursery:

            async def give_way() -> None:
                await self._realtime_submitted.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(give_way)
            elastic = self._elastic_s is not None
            first = self.unit_cost("step")  # a batch's first unit is a step
            await self._slack.acquire(first, beside_steps=self._beside, elastic=elastic)
            held = True  # (no checkpoint since the acquire: the window is ours)
            nursery.cancel_scope.cancel()
        if held and self._batcher.next_class() is Priority.REALTIME:
            self._slack.release(beside_steps=self._beside)  # it came in the same instant: first
            return False
        return held

    def _fail_all(self, reason: str) -> None:
        for ticket, waiting in list(self._waiting.items()):
            self._batcher.cancel(ticket)
            del self._waiting[ticket]
            if not waiting.gone:
                self._failed_requests += 1
                waiting.error = RequestFailed(reason)
                waiting.done.set()

    async def _run_batch(self, tickets: Sequence[int], *, gated: bool) -> None:
        """Run one batch; ``gated``: a batch-class batch, its first window already held."""
        batch = [self._waiting[ticket] for ticket in tickets]
        requests = [waiting.request for waiting in batch]
        slack = self._slack if gated else None
        gate = _Gate(
            batch,
            slack,
            self.unit_estimate,
            self.unit_cost,
            self._timer,
            self._beside,
            self._elastic_s,
        )
        gate.holding = gated
        start = gate.unit_started = self._timer()
        if slack is not None:
            gate.opened(slack)
        results: list[Res | BaseException]
        try:
            call = partial(self.runner.run_batch, requests, gate)
            results = list(await self._stoppable(gate, call))
            if len(results) != len(requests):
                got, asked = len(results), len(requests)
                raise RequestFailed(f"{self.name} returned {got} results for {asked} requests")
        except RequestCancelled as exc:  # every client left: nobody to tell
            self._stopped += 1
            results = [exc] * len(requests)
        except Exception as exc:  # told to every request of the batch, with the cause
            self._failed_batches += 1
            results = [exc] * len(requests)
        finally:
            gate.end()
        run_ms = (self._timer() - start) * 1000.0
        self._last_run_ms = run_ms
        for ticket, waiting, result in zip(tickets, batch, results, strict=True):
            del self._waiting[ticket]
            if waiting.gone:
                self._orphaned += 1
                continue
            if isinstance(result, BaseException):
                self._failed_requests += 1
                failure = RequestFailed(f"{self.name} failed: {type(result).__name__}")
                failure.__cause__ = result
                waiting.error = failure
            else:
                waiting.reply = Completed(result, run_ms, len(requests))
            waiting.done.set()

    async def _stoppable(self, gate: _Gate, call: Callable[[], Sequence[Res | Exception]]) -> (
        Sequence[Res | Exception]
    ):  # fmt: skip
        """``call()`` through the offload; if this task is cancelled meanwhile (the engine
        stops), the gate says so and the runner raises at its next `UnitGate.check`: a worker
        thread cannot be cancelled, and the shutdown would wait for its whole unit."""
        outcome: list[Sequence[Res | Exception]] = []
        failure: list[Exception] = []
        async with trio.open_nursery() as nursery:

            async def stop_when_cancelled() -> None:
                try:
                    await trio.sleep_forever()
                finally:
                    gate.stopping = True

            nursery.start_soon(stop_when_cancelled)
            try:
                outcome.append(await self._offload(call))
            except Exception as exc:  # raised below, outside the nursery (no group)
                failure.append(exc)
            finally:
                nursery.cancel_scope.cancel()
        if failure:
            raise failure[0]
        return outcome[0]

    def unit_cost(self, kind: str) -> UnitEstimate | float:
        """What a unit of ``kind`` asks the slack for: an elastic runner's own span, or the
        kind's estimate."""
        return self._elastic_s if self._elastic_s is not None else self.unit_estimate(kind)

    def unit_estimate(self, kind: str) -> UnitEstimate:
        """What the runner's next unit of ``kind`` will cost (`UnitGate.next_unit`)."""
        estimate = self._estimates.get(kind)
        if estimate is None:
            estimate = self._estimates[kind] = UnitEstimate(clock=self._timer)
        return estimate

    def statistics(self) -> RequestEngineStatistics:
        return RequestEngineStatistics(
            failed_batches=self._failed_batches,
            failed_requests=self._failed_requests,
            orphaned=self._orphaned,
            stopped_batches=self._stopped,
            last_run_ms=self._last_run_ms,
            batcher=self._batcher.statistics(),
        )
