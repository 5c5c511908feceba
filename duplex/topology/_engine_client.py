"""A session process's side of an engine process: a `SlotEngine` over a link.

`RemoteEngine` is what the session hub and its session actors hold when the
engine runs in its own process: the same calls as the in-process
``EngineDriver``. Opening a slot is a round trip (the engine process admits);
audio, video and resets are batched into one message per write
(``CommandBatch``); each tick's outputs arrive as one message and go to each
slot's subscriber (``SlotDelivery``: a full session drops, counted, with its
input accounting carried forward). Frames the engine refused (its input queue
full, which the session's own input bound should prevent) come back with the
slot's next output and are reported by the slot's next ``push_input``.

`EngineConnection` keeps one engine index connected: it connects (retrying
while the engine process starts), hands each new `RemoteEngine` to the hub
(which moves that engine's sessions onto it after a restart) and, when the link
ends, takes the engine out of admission until it is back. The request-batched
models the engine process hosts are registered in the process's
`RequestEngines` as `RemoteRequests` while the link lasts: a request is one
`SubmitRequest` and one `RequestDone`, a client that leaves sends
`CancelRequest`, and a link that ends fails what was in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, final

import trio

from duplex.exceptions import (
    EngineUnavailable,
    PromptUnsupported,
    RequestFailed,
    RequestsOverloaded,
)
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry, Sample
from duplex.models import (
    ENGINE_HISTOGRAMS,
    STALL_PERIODS,
    CapacityLimit,
    CapacityReport,
    Completed,
    DriverStatistics,
    Fanout,
    InputPush,
    ModelSpec,
    PcmFrame,
    Priority,
    RecorderSnapshot,
    RequestEngineStatistics,
    SlotDelivery,
    SlotEngine,
    SlotHandle,
    SlotOutput,
    SlotPrompt,
    Subscriber,
)
from duplex.runtime import RequestEngines

from ._engine_link import (
    CancelRequest,
    CloseSlot,
    CommandBatch,
    EngineStatus,
    Hello,
    OpenSlot,
    Outputs,
    RequestDone,
    RunnerInfo,
    SlotOpened,
    SubmitRequest,
    decode,
)
from ._link import Link

CONNECT_RETRY_S = 0.1


class EngineSet(Protocol):
    """The engines a session process holds now (the session hub)."""

    engines: dict[int, SlotEngine]
    export_engine_metrics: bool


class EngineHost(Protocol):
    """Who is told an engine started or stopped (the session hub)."""

    sleeping: bool
    """Its engines were stopped on purpose (``POST /v1/omni/sleep``): a link that ends
    then is no failure."""

    async def engine_started(self, engine: SlotEngine, index: int = 0) -> None: ...

    def engine_stopped(self, index: int, engine: SlotEngine) -> None: ...

    async def engine_lost(self, index: int, reason: str) -> None: ...


def _closed_report() -> CapacityReport:
    """No slot: what admission reads from an engine that is not (or no longer) linked."""
    return CapacityReport(0, 0, 0, CapacityLimit.POOL, None, None, math.inf)


@final
class RemoteEngine:
    """One engine process, as one incarnation of it is reached over one link."""

    def __init__(self, spec: ModelSpec, index: int, link: Link) -> None:
        self.spec = spec
        self.index = index
        self.link = link
        self.connected = True
        self.last_tick_at = trio.current_time()
        self.progress_at = self.last_tick_at
        """When this engine last showed progress: a tick's outputs, a status whose tick
        count moved, or one with no live slot (nothing to tick): see `stalled_for`."""
        self._ticks: int | None = None
        self._report = _closed_report()
        self._statistics: DriverStatistics | None = None
        self.histograms: RecorderSnapshot | None = None
        """The engine process's latency histograms, as of its last status."""
        self.trims: tuple[tuple[int, ...], float] | None = None
        """The engine process's ``malloc_trim`` durations, as of its last status."""
        self._requests = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[SlotOpened]]] = {}
        self._handles: dict[tuple[int, int], SlotHandle] = {}
        self._rejected: dict[SlotHandle, int] = {}
        self._fanout: Fanout[SlotHandle, SlotOutput] = Fanout(self.detach)
        self._delivery = SlotDelivery(self._fanout)
        self._batch = CommandBatch()
        self._wrote = trio.Event()
        self._answers: dict[int, tuple[trio.Event, list[RequestDone]]] = {}
        self._request_statistics: Mapping[str, RequestEngineStatistics] = {}
        self.dropped_disconnected = 0
        """Input frames pushed after the link ended (the session moves once the engine is back)."""

    # -- SlotEngine ----------------------------------------------------------

    async def open_slot(
        self, owner: str, subscriber: Subscriber[SlotOutput], *, prompt: SlotPrompt | None = None
    ) -> SlotHandle | None:
        if not self.connected:
            return None
        request = next(self._requests)
        answered = trio.Event()
        box: list[SlotOpened] = []
        self._waiting[request] = (answered, box)
        self.link.post(OpenSlot(request, owner, prompt))
        try:
            await answered.wait()
        finally:
            self._waiting.pop(request, None)
        if not box:  # the link ended first
            return None
        answer = box[0]
        self._report = answer.report
        if answer.error is not None:
            raise PromptUnsupported(answer.error)
        if answer.slot < 0:
            return None
        handle = SlotHandle(answer.slot, owner, answer.generation)
        if not self.connected:
            return None
        if not self._handles:  # idle until now: the tick clock starts again with this slot
            self.last_tick_at = trio.current_time()
        self._handles[(handle.slot, handle.generation)] = handle
        self._delivery.add(handle, subscriber)
        return handle

    def detach(self, handle: SlotHandle) -> bool:
        if self._handles.pop((handle.slot, handle.generation), None) is None:
            return False
        self._delivery.remove(handle)
        self._rejected.pop(handle, None)
        self.link.post(CloseSlot(handle.slot, handle.generation))
        return True

    def push_input(self, handle: SlotHandle, pcm: PcmFrame) -> InputPush:
        frames = len(pcm) // self.spec.frame_samples
        if not self.connected:
            self.dropped_disconnected += frames
            return InputPush(frames, 0, 0, 0)
        rejected = self._rejected.pop(handle, 0)
        self._batch.pcm(handle, pcm)
        self._wrote.set()
        return InputPush(frames, rejected, 0, 0)

    def push_video(self, handle: SlotHandle, frame_id: str, pts_ms: int, payload: bytes) -> int:
        if self.connected:
            self._batch.video(handle, frame_id, pts_ms, payload)
            self._wrote.set()
        return 0

    def reset(self, handle: SlotHandle, epoch: int, *, clear_input: bool = True) -> None:
        if self.connected:
            self._batch.reset(handle, epoch, clear_input)
            self._wrote.set()

    def capacity(self) -> CapacityReport:
        return self._report

    # -- the request engines hosted by the engine process ----------------------

    async def submit_request(
        self, runner: str, payload: Any, priority: Priority = Priority.BATCH
    ) -> Completed[Any]:
        """One request to ``runner`` in the engine process; cancelling withdraws it there.

        Raises:
            RequestsOverloaded: its queue there is full.
            EngineUnavailable: the link ended before the answer, or there is none (the
                engine process is being restarted).
            RequestFailed: it failed there.
        """
        if not self.connected:
            raise EngineUnavailable(f"{runner}: the engine process is not linked")
        request = next(self._requests)
        answered = trio.Event()
        box: list[RequestDone] = []
        self._answers[request] = (answered, box)
        self.link.post(SubmitRequest(request, runner, payload, priority))
        try:
            await answered.wait()
        except BaseException:
            if self.connected and not box:
                self.link.post(CancelRequest(request))
            raise
        finally:
            self._answers.pop(request, None)
        if not box:
            raise EngineUnavailable(f"{runner}: the engine process exited")
        done = box[0]
        if done.retry_after_s is not None:
            raise RequestsOverloaded(done.error or runner, retry_after_s=done.retry_after_s)
        if done.error is not None:
            raise RequestFailed(done.error)
        return Completed(done.result, done.run_ms, done.batch_size)

    def request_statistics(self, runner: str) -> RequestEngineStatistics | None:
        """``runner``'s counters in the engine process, as of its latest status."""
        return self._request_statistics.get(runner)

    def statistics(self) -> DriverStatistics | None:
        return self._statistics

    # -- the link ------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Slots this process holds on the engine."""
        return len(self._handles)

    def stalled(self, now: float) -> bool:
        """Live slots, yet no tick for ``STALL_PERIODS`` frame periods."""
        if not self.connected:
            return False
        quiet = now - self.last_tick_at
        return bool(self._handles) and quiet > STALL_PERIODS * self.spec.frame_period_s

    def stalled_for(self, now: float) -> float:
        """Seconds this engine has had live slots (of any session process) without
        progress; 0 while it ticks, has nothing to tick, or is not linked.

        Progress is a tick's outputs here, or a status (every ``STATUS_PERIOD_S``) whose
        tick count moved or that reports no live slot. A stopped process (SIGSTOP) sends
        nothing; one whose step is stuck in a kernel sends statuses with the same tick
        count: both stall. The live slots are the engine's own count (its last status),
        so a process with no session on the engine still sees it stall.
        """
        if not self.connected or not (self._handles or self._report.live):
            return 0.0
        return max(0.0, now - self.progress_at)

    async def write_loop(self) -> None:
        """Posts the commands batched since the last write as one message."""
        while True:
            await self._wrote.wait()
            self._wrote = trio.Event()
            if self._batch:
                self.link.post_framed(self._batch.take())
            await trio.lowlevel.checkpoint()

    def on_message(self, message: object) -> None:
        match message:
            case Outputs():
                self.last_tick_at = self.progress_at = trio.current_time()
                for output, rejected in message.entries(self._handles):
                    handle = output.handle
                    if rejected:
                        self._rejected[handle] = self._rejected.get(handle, 0) + rejected
                    self._delivery.deliver(handle, output)
            case EngineStatus(report, statistics, histograms, requests, trims):
                if not report.live or statistics.ticks != self._ticks:
                    self.progress_at = trio.current_time()
                self._ticks = statistics.ticks
                self._report = report
                self._statistics = statistics
                self.histograms = histograms
                self._request_statistics = requests
                self.trims = trims
            case RequestDone(request):
                answer = self._answers.get(request)
                if answer is not None:
                    answer[1].append(message)
                    answer[0].set()
            case SlotOpened(request):
                waiting = self._waiting.get(request)
                if waiting is not None:
                    waiting[1].append(message)
                    waiting[0].set()
            case _:
                raise TypeError(f"unexpected message from the engine: {message!r}")

    def disconnect(self) -> None:
        """The link ended: refuse new slots, drop input, wake every open waiting."""
        self.connected = False
        self._report = _closed_report()
        for answered, _ in self._waiting.values():
            answered.set()
        for answered, _ in self._answers.values():
            answered.set()


@final
class RemoteRequests:
    """A request engine hosted by an engine process, as a `RequestService` of this one."""

    def __init__(self, info: RunnerInfo, engine: RemoteEngine) -> None:
        self._info = info
        self.engine = engine

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._info.metadata

    async def submit(self, request: Any, *, priority: Priority = Priority.BATCH) -> Any:
        return (await self.submit_timed(request, priority=priority)).result

    async def submit_timed(
        self, request: Any, *, priority: Priority = Priority.BATCH
    ) -> Completed[Any]:
        return await self.engine.submit_request(self.name, request, priority)

    def retry_after_s(self) -> float:
        return 1.0

    def statistics(self) -> RequestEngineStatistics | None:
        return self.engine.request_statistics(self.name)


def export_engine_histograms(registry: MetricsRegistry, model: str, hub: EngineSet) -> None:
    """Export the engine processes' latency histograms (`ENGINE_HISTOGRAMS`) from their
    statuses, one label set per engine (``engine``), when ``hub`` exports engine figures
    (one session process does)."""

    def collector(name: str) -> Callable[[], Iterator[Sample]]:
        def collect() -> Iterator[Sample]:
            if not hub.export_engine_metrics:
                return
            for index, engine in sorted(hub.engines.items()):
                if isinstance(engine, RemoteEngine) and engine.histograms is not None:
                    labels = {"model": model, "engine": str(index)}
                    yield from engine.histograms.samples(name, labels)

        return collect

    for name, help_text in ENGINE_HISTOGRAMS:
        registry.add_collector(name, "histogram", help_text, collector(name))


async def engine_spec(path: str) -> ModelSpec:
    """What the engine process at ``path`` serves (its greeting), before any hub exists:
    the engine process owns the model, so a session process never builds or sizes it.

    Raises:
        RuntimeError: the engine process closed the link before greeting.
    """
    link = Link(await _connect(path), decode=decode)
    try:
        hello = await anext(link.messages(), None)
    finally:
        await link.stream.aclose()
    if not isinstance(hello, Hello):
        raise RuntimeError(f"the engine process at {path} did not say what it serves")
    return hello.spec


async def _connect(path: str) -> trio.SocketStream:
    """A stream to ``path``, retried while nothing listens there yet (starting, restarting)."""
    while True:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect(path)
        except OSError:
            sock.close()
            await trio.sleep(CONNECT_RETRY_S)
            continue
        return trio.SocketStream(sock)


@final
class EngineConnection:
    """Keeps this session process linked to engine ``index`` at ``path``, across restarts."""

    def __init__(
        self,
        spec: ModelSpec,
        index: int,
        path: str,
        host: EngineHost,
        requests: RequestEngines | None = None,
    ) -> None:
        self.spec = spec
        self.index = index
        self.path = path
        self.host = host
        self.requests = requests
        self.connects = 0
        self.ready = trio.Event()
        self.log = get_logger(component="engine-link", engine=index)

    async def run(self) -> None:
        """Forever: connect, serve, reconnect (``ready`` is set once the first engine is in use)."""
        while True:
            link = Link(await _connect(self.path), decode=decode)
            try:
                await link.while_sending(self._serve, link)
            finally:
                with trio.CancelScope(shield=True):
                    await link.stream.aclose()
            await trio.sleep(CONNECT_RETRY_S)

    async def _serve(self, link: Link) -> None:
        messages = link.messages()
        hello = await anext(messages, None)
        if not isinstance(hello, Hello):
            return  # the engine process went away as we connected
        if dataclasses.replace(hello.spec, max_slots=self.spec.max_slots) != self.spec:
            raise RuntimeError(
                f"engine {self.index} serves {hello.spec!r}, this process expects {self.spec!r}"
            )
        engine = RemoteEngine(hello.spec, self.index, link)
        services = [RemoteRequests(info, engine) for info in hello.runners]
        self.connects += 1
        if self.connects > 1:
            self.log.warning("engine process back; moving its sessions onto it")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.write_loop)
                first = await anext(messages, None)  # its status: admission has figures
                if first is not None:
                    engine.on_message(first)
                await self.host.engine_started(engine, self.index)
                if self.requests is not None:
                    for service in services:
                        await self.requests.started(service, replaces=False)
                self.ready.set()
                async for message in messages:
                    engine.on_message(message)
                nursery.cancel_scope.cancel()
        finally:
            engine.disconnect()
            self.host.engine_stopped(self.index, engine)
            if self.requests is not None:
                for service in services:
                    self.requests.stopped(service)
        # not reached when this process stops (cancelled): only an engine that went away
        if self.host.sleeping:
            self.log.info("engine link ended: the engine sleeps", sessions=engine.slots)
        else:
            self.log.error("engine link ended", sessions=engine.slots)
        await self.host.engine_lost(self.index, "the engine process exited")
