"""`PolicyEngine`: many robots' inference requests, batched, run off the trio thread.

The narrow interface is one call: ``await engine.infer(request)`` returns that
request's `PolicyReply` or raises `PolicyFailed` / `PolicyOverloaded`. Behind it
a `PolicyBatcher` decides on numbers when a batch is due (``_policy_batcher.py``)
and `run`, the engine's loop, takes each batch when the policy is free, calls
``policy.infer_batch`` once through ``offload`` (a worker thread by default) and
hands each robot its own result. Nothing here knows about sockets or the wire,
so the same interface can later be served from an engine process.

A request whose robot leaves while it waits is withdrawn; one whose batch is
already running finishes and its result is dropped (counted as orphaned). A
policy that raises fails only its batch: each request in it gets `PolicyFailed`
with the cause chained, and the loop goes on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, final

import trio

from duplex.exceptions import PolicyFailed, PolicyOverloaded

from ._driver import Offload
from ._policy import Policy, PolicyRequest, PolicyResult
from ._policy_batcher import BatcherStatistics, PolicyBatcher

__all__ = ["POLICY_METRICS", "PolicyEngine", "PolicyEngineStatistics", "PolicyReply"]

DEFAULT_MAX_QUEUE: Final = 1024


@final
@dataclass(frozen=True, slots=True)
class PolicyReply:
    """One request's result.

    Args:
        result: what the policy returned for it (a map of arrays, or an array).
        infer_ms: the policy call's time for the whole batch it ran in.
        batch_size: how many requests that batch held.
    """

    result: PolicyResult = field(repr=False)
    infer_ms: float
    batch_size: int


@final
@dataclass(frozen=True, slots=True)
class PolicyEngineStatistics:
    """The engine's counters, with its batcher's.

    Args:
        failed_batches: policy calls that raised or broke the contract.
        failed_requests: requests answered with `PolicyFailed`.
        orphaned: results dropped because their robot had left.
        last_infer_ms: the latest policy call's time (``None`` before the first).
        batcher: the queue's record.
    """

    failed_batches: int
    failed_requests: int
    orphaned: int
    last_infer_ms: float | None
    batcher: BatcherStatistics

    def metric(self, name: str) -> float | None:
        """The value of `POLICY_METRICS` entry ``name``."""
        batcher = self.batcher
        values: dict[str, float | None] = {
            "duplex_policy_requests_total": batcher.submitted,
            "duplex_policy_batches_total": batcher.batches,
            "duplex_policy_batched_requests_total": batcher.batched,
            "duplex_policy_largest_batch": batcher.largest_batch,
            "duplex_policy_queued": batcher.queued,
            "duplex_policy_refused_total": batcher.refused,
            "duplex_policy_cancelled_total": batcher.cancelled,
            "duplex_policy_failed_requests_total": self.failed_requests,
            "duplex_policy_orphaned_total": self.orphaned,
            "duplex_policy_last_infer_seconds": (
                None if self.last_infer_ms is None else self.last_infer_ms / 1000.0
            ),
        }
        return values[name]


POLICY_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_policy_requests_total", "counter", "Robot inference requests queued"),
    ("duplex_policy_batches_total", "counter", "Policy calls (batches) run"),
    ("duplex_policy_batched_requests_total", "counter", "Requests run in batches"),
    ("duplex_policy_largest_batch", "gauge", "The largest batch run so far"),
    ("duplex_policy_queued", "gauge", "Requests waiting for the policy now"),
    ("duplex_policy_refused_total", "counter", "Requests refused: the queue was full"),
    ("duplex_policy_cancelled_total", "counter", "Requests withdrawn: their robot left"),
    ("duplex_policy_failed_requests_total", "counter", "Requests whose inference failed"),
    ("duplex_policy_orphaned_total", "counter", "Results dropped: their robot had left"),
    ("duplex_policy_last_infer_seconds", "gauge", "The latest policy call's time"),
)
"""The policy engine's metrics (name, kind, help), read from `PolicyEngineStatistics.metric`."""


@dataclass(slots=True, eq=False)
class _Waiting:
    request: PolicyRequest
    done: trio.Event = field(default_factory=trio.Event)
    reply: PolicyReply | None = None
    error: PolicyFailed | None = None
    gone: bool = False


@final
class PolicyEngine:
    """Batches concurrent `infer` calls into ``policy.infer_batch`` calls.

    Args:
        policy: the batched policy.
        max_batch: the most requests one policy call takes.
        max_wait_s: how long a request waits for others before its batch runs.
        max_queue: the most requests waiting at once; more raise `PolicyOverloaded`.
        offload: how a policy call leaves the trio thread (``None``:
            ``trio.to_thread.run_sync``); tests pass an inline one for ``MockClock``.
        timer: monotonic seconds, used only to measure a policy call.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_queue: int = DEFAULT_MAX_QUEUE,
        offload: Offload | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        self._batcher = PolicyBatcher(
            max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max(max_queue, max_batch)
        )
        self._offload: Offload = offload or trio.to_thread.run_sync
        self._timer = timer
        self._tickets = itertools.count()
        self._waiting: dict[int, _Waiting] = {}
        self._submitted = trio.Event()
        self._failed_batches = 0
        self._failed_requests = 0
        self._orphaned = 0
        self._last_infer_ms: float | None = None

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The policy's metadata (what a robot is told on connect)."""
        return self.policy.metadata

    async def infer(self, request: PolicyRequest) -> PolicyReply:
        """Queue ``request`` and wait for its result.

        Raises:
            PolicyOverloaded: the queue is full (the request did not run).
            PolicyFailed: the policy raised for its batch, or returned an exception,
                or nothing, for it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        ticket = next(self._tickets)
        if not self._batcher.submit(ticket, trio.current_time()):
            raise PolicyOverloaded(f"{self._batcher.max_queue} requests already wait")
        waiting = self._waiting[ticket] = _Waiting(request)
        self._submitted.set()
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
                await self._run_batch(self._batcher.take())
        finally:  # stopped or crashed: no request is left waiting on a dead loop
            self._fail_all("the policy engine stopped")

    def _fail_all(self, reason: str) -> None:
        for ticket, waiting in list(self._waiting.items()):
            self._batcher.cancel(ticket)
            del self._waiting[ticket]
            if not waiting.gone:
                self._failed_requests += 1
                waiting.error = PolicyFailed(reason)
                waiting.done.set()

    async def _run_batch(self, tickets: Sequence[int]) -> None:
        batch = [self._waiting[ticket] for ticket in tickets]
        requests = [waiting.request for waiting in batch]
        start = self._timer()
        try:
            results = list(await self._offload(partial(self.policy.infer_batch, requests)))
            if len(results) != len(requests):
                got, asked = len(results), len(requests)
                raise PolicyFailed(f"the policy returned {got} results for {asked} requests")
        except Exception as exc:  # told to every request of the batch, with the cause
            self._failed_batches += 1
            results = [exc] * len(requests)
        infer_ms = (self._timer() - start) * 1000.0
        self._last_infer_ms = infer_ms
        for ticket, waiting, result in zip(tickets, batch, results, strict=True):
            del self._waiting[ticket]
            if waiting.gone:
                self._orphaned += 1
                continue
            if isinstance(result, BaseException):
                self._failed_requests += 1
                failure = PolicyFailed(f"inference failed: {type(result).__name__}")
                failure.__cause__ = result
                waiting.error = failure
            else:
                waiting.reply = PolicyReply(result, infer_ms, len(requests))
            waiting.done.set()

    def statistics(self) -> PolicyEngineStatistics:
        return PolicyEngineStatistics(
            failed_batches=self._failed_batches,
            failed_requests=self._failed_requests,
            orphaned=self._orphaned,
            last_infer_ms=self._last_infer_ms,
            batcher=self._batcher.statistics(),
        )
