"""The session hub: admission, the registry of live sessions, socket generations.

Sessions take an engine slot when they are admitted and give it back when
the session actor releases its resources; only then does capacity return.
A session with ``vad="silero"`` also takes a stream on the shared VAD at
admission (held for its whole life, so a later ``session.update`` that turns
detection on never waits on capacity); no stream refuses the session with
``resource_exhausted``, never a silent fall-back to another VAD.

Capacity has one source, `SessionHub.capacity`: the engine's measured capacity
(``CapacityReport``) under the configured bound. Admission, ``/health`` and the
``duplex_engine_capacity_slots`` gauge all read it. Every refusal is counted by
reason and logged (rate-limited by `RefusalLog`) with the figures behind it.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

import trio

from duplex import exceptions as errors
from duplex.actors import ActorRef, ActorSystem, Restart
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry, Sample
from duplex.models import (
    CapacityLimit,
    CapacityReport,
    DriverStatistics,
    EngineDriver,
    ModelSpec,
    VadDriver,
    VadDriverStatistics,
    VadWindow,
)
from duplex.sessions import (
    Admission,
    Capabilities,
    RefusalLog,
    RefusalReason,
    SessionConfig,
    SessionMachine,
    SessionOptions,
    new_session_id,
)

from ._actor import (
    VAD_WINDOW_BUFFER,
    EngineReplaced,
    EngineSink,
    Inspect,
    SessionActor,
    SessionResources,
    VadReplaced,
    VadResources,
    slot_prompt,
)
from ._vad_link import VadLink

_ENGINE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_engine_ticks_total", "counter", "Engine ticks (current engine)"),
    ("duplex_engine_late_ticks_total", "counter", "Ticks whose step ended after the next tick"),
    ("duplex_engine_underruns_total", "counter", "Slot-ticks with no input (played as silence)"),
    ("duplex_engine_silence_skipped_total", "counter", "Queued silent frames skipped to repay lag"),
    ("duplex_engine_outputs_dropped_total", "counter", "Outputs dropped: a session fell behind"),
    ("duplex_engine_input_frames_rejected_total", "counter", "Input frames refused (queue full)"),
    ("duplex_engine_video_frames_dropped_total", "counter", "Video frames dropped (queue full)"),
    ("duplex_engine_live_slots", "gauge", "Slots in use"),
    ("duplex_engine_capacity_slots", "gauge", "Sessions admission allows now (as /health)"),
    ("duplex_engine_step_p99_seconds", "gauge", "p99 step time over the recent window"),
    ("duplex_engine_warmup_steps_total", "counter", "Warm-up steps kept out of the window"),
)


def _engine_value(name: str, stats: DriverStatistics) -> float | None:
    engine, sched = stats.engine, stats.engine.scheduler
    values: dict[str, float | None] = {
        "duplex_engine_ticks_total": stats.ticks,
        "duplex_engine_late_ticks_total": stats.late_ticks,
        "duplex_engine_underruns_total": engine.underruns,
        "duplex_engine_silence_skipped_total": engine.silence_skipped,
        "duplex_engine_outputs_dropped_total": stats.dropped_full + stats.dropped_closed,
        "duplex_engine_input_frames_rejected_total": engine.frames_rejected,
        "duplex_engine_video_frames_dropped_total": engine.video_dropped,
        "duplex_engine_live_slots": engine.live_slots,
        "duplex_engine_step_p99_seconds": sched.p99_step_s,
        "duplex_engine_warmup_steps_total": engine.warmup_steps,
    }
    return values[name]


_VAD_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_vad_streams", "gauge", "Sessions holding a stream on the shared VAD"),
    ("duplex_vad_capacity_streams", "gauge", "Size of the shared VAD's stream pool"),
    ("duplex_vad_late_ticks_total", "counter", "VAD ticks whose steps ended after the next tick"),
    ("duplex_vad_windows_dropped_total", "counter", "VAD windows dropped (queue or mailbox full)"),
    ("duplex_vad_step_seconds", "gauge", "Compute time of the last VAD forward"),
)


def _vad_value(name: str, stats: VadDriverStatistics) -> float:
    values: dict[str, float] = {
        "duplex_vad_streams": stats.vad.streams,
        "duplex_vad_capacity_streams": stats.vad.max_streams,
        "duplex_vad_late_ticks_total": stats.late_ticks,
        "duplex_vad_windows_dropped_total": stats.vad.windows_dropped + stats.dropped_full,
        "duplex_vad_step_seconds": stats.vad.last_step_s,
    }
    return values[name]


ENGINE_OUTPUT_BUFFER = 8
"""Frames of engine output a session may fall behind before the driver drops (counted)."""


@final
@dataclass(frozen=True, slots=True)
class Opened:
    session_id: str
    ref: ActorRef[Any]


@final
class SessionHub:
    """Opens sessions against one engine and finds them again for resume.

    The engine actor hands over each driver it starts (`engine_started`); a
    replacement after a crash moves every live session onto the new one.
    """

    def __init__(
        self,
        system: ActorSystem,
        spec: ModelSpec,
        *,
        config: SessionConfig,
        capabilities: Capabilities,
        max_sessions: int = 0,
        registry: MetricsRegistry,
        shard: int | None = None,
    ):
        """``shard``: this process's index among session shards; its sessions' ids carry it
        (``duplex-s<shard>-<32 hex>``) so a worker can route a resume to it."""
        self.system = system
        self.spec = spec
        self.driver: EngineDriver | None = None
        self.engine_starts = 0
        self.vad: VadDriver | None = None
        self.vad_starts = 0
        self.config = config
        self.capabilities = capabilities
        capacity = spec.max_slots
        if max_sessions:
            capacity = min(capacity, max_sessions)
        self.admission = Admission(capacity)
        self.shard = shard
        self.on_load: Callable[[], None] | None = None
        """Called after each admission attempt and each release (a shard tells its workers,
        which count a session they send as taken until then)."""
        self._sessions: dict[str, ActorRef[Any]] = {}
        self._generations = itertools.count(1)
        self._opened = registry.counter("duplex_sessions_opened_total", "Sessions admitted")
        self._refused = registry.counter(
            "duplex_sessions_refused_total", "Sessions refused for capacity, by reason", ["reason"]
        )
        self._refusal_log = RefusalLog()
        self._log = get_logger(component="admission", model=spec.name)
        registry.add_collector(
            "duplex_sessions_live", "gauge", "Sessions holding engine resources", self._collect
        )
        for name, kind, help_text in _ENGINE_METRICS:
            registry.add_collector(name, kind, help_text, self._engine_sampler(name))
        for name, kind, help_text in _VAD_METRICS:
            registry.add_collector(name, kind, help_text, self._vad_sampler(name))

    def _collect(self) -> list[Sample]:
        return [Sample("duplex_sessions_live", {}, self.admission.statistics().live)]

    def _engine_sampler(self, name: str) -> Callable[[], list[Sample]]:
        def collect() -> list[Sample]:
            if self.driver is None:
                return []
            if name == "duplex_engine_capacity_slots":  # the figure /health and admission use
                return [Sample(name, {"model": self.spec.name}, self.capacity())]
            value = _engine_value(name, self.driver.statistics())
            if value is None:
                return []
            return [Sample(name, {"model": self.spec.name}, value)]

        return collect

    def _vad_sampler(self, name: str) -> Callable[[], list[Sample]]:
        def collect() -> list[Sample]:
            if self.vad is None:
                return []
            return [Sample(name, {"model": "silero"}, _vad_value(name, self.vad.statistics()))]

        return collect

    def capacity(self) -> int:
        """Sessions that may hold engine resources at once now: the engine's measured
        capacity under the configured bound; 0 while no engine runs."""
        driver = self.driver
        if driver is None:
            return 0
        return min(self.admission.bound, driver.capacity().slots)

    def _refusal(
        self, reason: RefusalReason, message: str, **figures: object
    ) -> errors.ResourceExhausted:
        """Count and (rate-limited) log one refusal; the error to raise."""
        self._refused.inc(reason=reason.value)
        unlogged = self._refusal_log.note(reason, trio.current_time())
        if unlogged is not None:
            self._log.warning(
                "session refused",
                reason=reason.value,
                detail=message,
                live=self.admission.live,
                capacity=self.capacity(),
                unlogged_since_last=unlogged,
                **figures,
            )
        return errors.ResourceExhausted(message)

    def _engine_refusal(self, report: CapacityReport) -> errors.ResourceExhausted:
        """The refusal the engine's capacity explains: no free slot id, or step time."""
        if report.free_ids == 0:
            return self._refusal(
                RefusalReason.SLOTS,
                f"duplex_session_capacity_exhausted: limit={self.spec.max_slots}: every "
                "engine slot is taken",
                releasing=self.spec.max_slots - report.live - report.free_ids,
            )
        p99 = "expired" if report.over_p99_s is None else f"{report.over_p99_s * 1000:.1f} ms"
        return self._refusal(
            RefusalReason.STEP_TIME,
            f"duplex_session_capacity_exhausted: limit={report.slots}: step time at "
            f"{report.over_batch} slots is over budget (p99 {p99}, budget "
            f"{report.budget_s * 1000:.1f} ms)",
            over_batch=report.over_batch,
            over_p99_s=report.over_p99_s,
            budget_s=report.budget_s,
            probe=report.limit is CapacityLimit.PROBE,
        )

    @property
    def ready(self) -> bool:
        """An engine is running: sessions can be admitted."""
        return self.driver is not None

    async def engine_started(self, driver: EngineDriver) -> None:
        """A (new) engine runs; after a crash, every live session moves onto it."""
        previous, self.driver = self.driver, driver
        self.engine_starts += 1
        if previous is None:
            return
        get_logger(component="engine", model=self.spec.name).info(
            "engine restarted", restarts=self.engine_starts - 1, sessions=len(self._sessions)
        )
        for ref in list(self._sessions.values()):
            await ref.tell(EngineReplaced(driver, "engine crashed"))

    async def vad_started(self, driver: VadDriver) -> None:
        """A (new) shared VAD runs; after a crash, every live session moves onto it
        (sessions without a VAD stream ignore the message)."""
        previous, self.vad = self.vad, driver
        self.vad_starts += 1
        if previous is None:
            return
        for ref in list(self._sessions.values()):
            await ref.tell(VadReplaced(driver))

    def _attach_vad(self, session_id: str, config: SessionConfig) -> VadResources | None:
        """A stream on the shared VAD when the session's config uses it.

        Raises:
            ResourceExhausted: the VAD is not running, or its stream pool is full.
        """
        if config.vad != "silero":
            return None
        vad = self.vad
        if vad is None:
            raise errors.ResourceExhausted("duplex_vad_unavailable: the VAD is not running")
        send, recv = trio.open_memory_channel[VadWindow](VAD_WINDOW_BUFFER)
        handle = vad.attach(session_id, send)
        if handle is None:
            limit = vad.statistics().vad.max_streams
            raise errors.ResourceExhausted(f"duplex_vad_capacity_exhausted: limit={limit}")
        return VadResources(VadLink(vad, handle, config), recv)

    def next_generation(self) -> int:
        """A fresh socket generation (unique per process)."""
        return next(self._generations)

    def lookup(self, session_id: str) -> ActorRef[Any] | None:
        return self._sessions.get(session_id)

    async def open(self, options: SessionOptions | None) -> Opened:
        """Admit and start a session (see ``_open``); tells ``on_load`` either way."""
        try:
            return await self._open(options)
        finally:
            self._load_changed()

    async def _open(self, options: SessionOptions | None) -> Opened:
        """Admit and start a session.

        Raises:
            BadEvent: the options make an invalid configuration.
            ResourceExhausted: no capacity (engine slots, step time, ``max_sessions``,
                or VAD streams for a ``vad="silero"`` session).
        """
        driver = self.driver
        if driver is None:
            raise self._refusal(RefusalReason.STARTING, "the engine is not running yet")
        config = self.config
        if options is not None:
            try:
                config = config.updated(options)
            except errors.ConfigError as exc:
                param = f"session.{getattr(exc, 'key', '')}".rstrip(".")
                raise errors.BadEvent(str(exc), param=param) from exc
        session_id = None if self.shard is None else new_session_id(os.urandom, self.shard)
        machine = SessionMachine(config, self.capabilities, session_id=session_id)
        session_id = machine.session_id
        report = driver.capacity()
        if self.admission.live >= self.admission.bound:
            limit = self.admission.bound
            raise self._refusal(
                RefusalReason.MAX_SESSIONS if limit < self.spec.max_slots else RefusalReason.SLOTS,
                f"duplex_session_capacity_exhausted: limit={limit}",
            )
        if not report.admits:
            raise self._engine_refusal(report)
        self.admission.try_admit(session_id)
        sink = EngineSink(ENGINE_OUTPUT_BUFFER)
        try:
            handle = driver.attach(session_id, sink, prompt=slot_prompt(config))
        except errors.PromptUnsupported as exc:  # no prompts, or a voice it does not have
            self.admission.release(session_id)
            raise errors.UnsupportedParameter(str(exc), param="session.prompt") from exc
        if handle is None:  # a step changed the figures since the check above
            self.admission.release(session_id)
            raise self._engine_refusal(driver.capacity())
        try:
            vad = self._attach_vad(session_id, config)
        except errors.ResourceExhausted as exc:
            driver.detach(handle)
            self.admission.release(session_id)
            raise self._refusal(RefusalReason.VAD, str(exc)) from None
        resources = SessionResources(driver, handle, sink, vad=vad)
        try:
            ref = await self.system.spawn(
                SessionActor,
                machine,
                resources,
                self,
                name=session_id,
                restart=Restart.TEMPORARY,
                lanes=SessionActor.lanes_for(config),
            )
        except BaseException:
            driver.detach(handle)
            if vad is not None:
                vad.link.close()
            self.admission.release(session_id)
            raise
        self._sessions[session_id] = ref
        self._opened.inc()
        if self.driver is not driver:  # the engine restarted while the session was starting
            await ref.tell(EngineReplaced(self.driver, "engine crashed"))  # type: ignore[arg-type]
        if vad is not None and self.vad is not vad.link.streams:  # so did the VAD
            await ref.tell(VadReplaced(self.vad))  # type: ignore[arg-type]
        return Opened(session_id, ref)

    def released(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self.admission.release(session_id)
        self._load_changed()

    def _load_changed(self) -> None:
        if self.on_load is not None:
            self.on_load()

    async def inspect(self, session_id: str) -> SessionMachine | None:
        """The live machine of a session (diagnostics and tests)."""
        ref = self._sessions.get(session_id)
        if ref is None:
            return None
        return await ref.ask(Inspect(), timeout=math.inf)
