"""The session hub: admission, the registry of live sessions, socket generations.

Sessions take an engine slot when they are admitted and give it back when
the session actor releases its resources; only then does capacity return.
A session with ``vad="silero"`` also takes a slot on the shared VAD (one more engine) at
admission (held for its whole life, so a later ``session.update`` that turns
detection on never waits on capacity); no stream refuses the session with
``resource_exhausted``, never a silent fall-back to another VAD.

Capacity has one source, `SessionHub.capacity`: the engine's measured capacity
(``CapacityReport``) under the configured bound. Admission, ``/health`` and the
``duplex_engine_capacity_slots`` gauge all read it. Every refusal is counted by
reason and logged (rate-limited by `RefusalLog`) with the figures behind it.
"""

from __future__ import annotations

import contextlib
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
    ENGINE_METRICS,
    VAD_METRICS,
    CapacityLimit,
    CapacityReport,
    EngineDriver,
    ModelSpec,
    SlotEngine,
    vad_metric,
)
from duplex.models.agent import AgentModels
from duplex.sessions import (
    Admission,
    Capabilities,
    RefusalLog,
    RefusalReason,
    SessionConfig,
    SessionMachine,
    SessionOptions,
    VadMode,
    new_session_id,
)

from ._actor import (
    EngineLost,
    EngineReplaced,
    Evict,
    Inspect,
    SessionActor,
    SessionResources,
    VadReplaced,
    VadResources,
    engine_sink,
    slot_prompt,
    vad_sink,
)
from ._agent_link import AgentLink
from ._vad_link import VadLink

ENGINE_OUTPUT_BUFFER = 8
"""Frames of engine output a session may fall behind before the driver drops (counted)."""


@final
@dataclass(frozen=True, slots=True)
class Opened:
    session_id: str
    ref: ActorRef[Any]


@final
class SessionHub:
    """Opens sessions against its engines and finds them again for resume.

    Each engine (one in process, or one per engine process: ``index``) is handed over
    when it starts (`engine_started`); a replacement after a crash moves every live
    session of that engine onto the new one. A new session goes to the engine with
    the most room; a session stays on its engine for its whole life.
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
        node: str | None = None,
        export_engine_metrics: bool = True,
    ):
        """``shard``: this process's index among session shards; its sessions' ids carry it
        (``duplex-s<shard>-<32 hex>``) so a worker can route a resume to it. ``node``: the
        cluster node this server is (``duplex-n<node>-...``), for the cluster's ingress.
        ``export_engine_metrics``: off in every session process but the first when engines
        run in their own processes (one engine's figures are exported once)."""
        self.system = system
        self.spec = spec
        self.engines: dict[int, SlotEngine] = {}
        """The running engine of each index (one per device)."""
        self.engine_starts = 0
        self.export_engine_metrics = export_engine_metrics
        self.vad: EngineDriver | None = None
        """The shared silero VAD's engine, once it runs (sessions with ``vad="silero"``)."""
        self.vad_starts = 0
        self.agent: AgentModels | None = None
        """The agent's shared stages, once they run (with ``Capabilities.agent_cascade``)."""
        self.config = config
        self.capabilities = capabilities
        capacity = spec.max_slots
        if max_sessions:
            capacity = min(capacity, max_sessions)
        self.admission = Admission(capacity)
        self.shard = shard
        self.node = node
        self._on_load: Callable[[], None] | None = None
        self._sessions: dict[str, ActorRef[Any]] = {}
        self.sleeping = False
        """The engine was put to sleep (``POST /v1/omni/sleep``): `open` refuses
        ``engine_sleeping`` until it is woken (``duplex.topology`` runs the sleep)."""
        self._engine_indices: set[int] = set()
        """Engines that have started at least once (a later start is a restart)."""
        self._placed: dict[str, int] = {}
        """The engine index each live session holds its slot on."""
        self._generations = itertools.count(1)
        self._opened = registry.counter("duplex_sessions_opened_total", "Sessions admitted")
        self._refused = registry.counter(
            "duplex_sessions_refused_total", "Sessions refused for capacity, by reason", ["reason"]
        )
        self._let_go = registry.counter(
            "duplex_sessions_sockets_let_go_total",
            "Sockets a session let go: their client read nothing while the writer's queue filled",
        )
        self._refusal_log = RefusalLog()
        self._log = get_logger(component="admission", model=spec.name)
        registry.add_collector(
            "duplex_sessions_live", "gauge", "Sessions holding engine resources", self._collect
        )
        registry.add_collector(
            "duplex_engine_capacity_slots",
            "gauge",
            "Sessions admission allows now (as /health)",
            self._capacity_sample,
        )
        registry.add_collector(
            "duplex_engine_stalled",
            "gauge",
            "1 while an engine has live slots and no tick for 25 frame periods",
            self._stalled_samples,
        )
        for name, kind, help_text in ENGINE_METRICS:
            registry.add_collector(name, kind, help_text, self._engine_sampler(name))
        for name, kind, help_text in VAD_METRICS:
            registry.add_collector(name, kind, help_text, self._vad_sampler(name))

    def _collect(self) -> list[Sample]:
        return [Sample("duplex_sessions_live", {}, self.admission.statistics().live)]

    def _capacity_sample(self) -> list[Sample]:
        """The figure /health and admission use."""
        if not self.engines:
            return []
        return [Sample("duplex_engine_capacity_slots", {"model": self.spec.name}, self.capacity())]

    def _engine_sampler(self, name: str) -> Callable[[], list[Sample]]:
        def collect() -> list[Sample]:
            if not self.export_engine_metrics:
                return []
            samples = []
            for index, engine in sorted(self.engines.items()):
                statistics = engine.statistics()
                value = None if statistics is None else statistics.metric(name)
                if value is None:
                    continue
                labels = {"model": self.spec.name}
                if len(self.engines) > 1:
                    labels["engine"] = str(index)
                samples.append(Sample(name, labels, value))
            return samples

        return collect

    def _vad_sampler(self, name: str) -> Callable[[], list[Sample]]:
        def collect() -> list[Sample]:
            if self.vad is None:
                return []
            return [Sample(name, {"model": "silero"}, vad_metric(self.vad.statistics(), name))]

        return collect

    def capacity(self) -> int:
        """Sessions that may hold engine resources at once now: the engines' measured
        capacity under the configured bound; 0 while no engine runs."""
        if not self.engines:
            return 0
        slots = sum(engine.capacity().slots for engine in self.engines.values())
        return min(self.admission.bound, slots)

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
        return bool(self.engines)

    async def engine_started(self, engine: SlotEngine, index: int = 0) -> None:
        """Engine ``index`` runs (again); after a crash, its live sessions move onto it."""
        self.engines[index] = engine
        self.engine_starts += 1
        self._load_changed()  # its room: workers route by it
        if index not in self._engine_indices:
            self._engine_indices.add(index)
            return
        moved = [sid for sid, placed in self._placed.items() if placed == index]
        get_logger(component="engine", model=self.spec.name).info(
            "engine restarted", engine=index, restarts=self.engine_starts - 1, sessions=len(moved)
        )
        for session_id in moved:
            ref = self._sessions.get(session_id)
            if ref is not None:
                await ref.tell(EngineReplaced(engine, "engine crashed"))

    async def evict_all(self, reason: str) -> int:
        """End every live session (a forced sleep of the engine): each client is told
        ``reason`` as an engine error, then its session closes. Returns how many."""
        sessions = list(self._sessions.values())
        for ref in sessions:
            await ref.tell(Evict(reason))
        return len(sessions)

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    def engine_stopped(self, index: int, engine: SlotEngine) -> None:
        """Engine ``index`` is gone until it starts again: no new session goes to it."""
        if self.engines.get(index) is engine:
            del self.engines[index]
            self._load_changed()

    async def engine_lost(self, index: int, reason: str) -> None:
        """Engine ``index`` died (its process exited): its sessions are told now, not when
        a new one is up (a 7B model takes minutes to load); they move on `engine_started`."""
        lost = [sid for sid, placed in self._placed.items() if placed == index]
        log = get_logger(component="engine", model=self.spec.name)
        say = log.info if self.sleeping and not lost else log.error
        say("engine lost", engine=index, reason=reason, sessions=len(lost))
        for session_id in lost:
            ref = self._sessions.get(session_id)
            if ref is not None:
                await ref.tell(EngineLost(reason))

    def engine_health(self) -> list[dict[str, Any]]:
        """Each engine this process has had: ``ok``, ``stalled`` (a tick far past its
        deadline, see ``SlotEngine.stalled``) or ``unavailable`` (restarting), and its
        ``slots`` now (0 while unavailable), so shards that share it count it once."""
        now = trio.current_time()
        health = []
        for index in sorted(self._engine_indices):
            engine = self.engines.get(index)
            status, slots = "unavailable", 0
            if engine is not None:
                status = "stalled" if engine.stalled(now) else "ok"
                slots = engine.capacity().slots
            health.append({"engine": index, "status": status, "slots": slots})
        return health

    def _stalled_samples(self) -> list[Sample]:
        now = trio.current_time()
        return [
            Sample(
                "duplex_engine_stalled",
                {"model": self.spec.name, "engine": str(index)},
                float(engine.stalled(now)),
            )
            for index, engine in sorted(self.engines.items())
        ]

    def _roomiest(self) -> tuple[int, SlotEngine, CapacityReport] | None:
        """The engine with the most room now (``None``: no engine runs)."""
        best = None
        for index, engine in sorted(self.engines.items()):
            report = engine.capacity()
            room = (report.admits, min(report.slots - report.live, report.free_ids))
            if best is None or room > best[0]:
                best = (room, index, engine, report)
        return None if best is None else best[1:]

    async def vad_started(self, driver: EngineDriver) -> None:
        """A (new) shared VAD runs; after a crash, every live session moves onto it
        (sessions without a VAD stream ignore the message)."""
        previous, self.vad = self.vad, driver
        self.vad_starts += 1
        if previous is None:
            return
        for ref in list(self._sessions.values()):
            await ref.tell(VadReplaced(driver))

    def watch_load(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after each admission attempt and each release (a shard tells
        its workers, which count a session they send as taken until then)."""
        self._on_load = callback

    def agent_started(self, models: AgentModels) -> None:
        """The agent's shared stages run: sessions opened from now on get an `AgentLink`."""
        self.agent = models

    def _attach_vad(self, session_id: str, config: SessionConfig) -> VadResources | None:
        """A slot on the shared VAD when the session's config uses it.

        Raises:
            ResourceExhausted: the VAD is not running, or its admission says no (its slot
                pool is full, or its measured step time allows no more).
        """
        if config.vad is not VadMode.SILERO:
            return None
        vad = self.vad
        if vad is None:
            raise errors.ResourceExhausted("duplex_vad_unavailable: the VAD is not running")
        sink = vad_sink()
        handle = vad.attach(session_id, sink)
        if handle is None:
            limit = vad.capacity().slots
            raise errors.ResourceExhausted(f"duplex_vad_capacity_exhausted: limit={limit}")
        return VadResources(VadLink(vad, handle, config), sink)

    def next_generation(self) -> int:
        """A fresh socket generation (unique per process)."""
        return next(self._generations)

    def lookup(self, session_id: str) -> ActorRef[Any] | None:
        return self._sessions.get(session_id)

    async def open(self, options: SessionOptions | None) -> Opened:
        """Admit and start a session (see ``_open``); tells `watch_load`'s callback either way."""
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
        if self.sleeping:
            self._refusal(RefusalReason.SLEEPING, "the engine sleeps")
            raise errors.EngineSleeping(
                "The engine is asleep (POST /v1/omni/sleep): no new session until an operator "
                "wakes it (POST /v1/omni/wakeup); retry later."
            )
        chosen = self._roomiest()
        if chosen is None:
            raise self._refusal(RefusalReason.STARTING, "the engine is not running yet")
        index, driver, report = chosen
        config = self.config
        if options is not None:
            config = config.accepting(options)
        session_id = None
        if self.shard is not None or self.node is not None:
            session_id = new_session_id(os.urandom, self.shard, self.node)
        machine = SessionMachine(config, self.capabilities, session_id=session_id)
        session_id = machine.session_id
        if self.admission.live >= self.admission.bound:
            limit = self.admission.bound
            raise self._refusal(
                RefusalReason.MAX_SESSIONS if limit < self.spec.max_slots else RefusalReason.SLOTS,
                f"duplex_session_capacity_exhausted: limit={limit}",
            )
        if not report.admits:
            raise self._engine_refusal(report)
        with contextlib.ExitStack() as undo:  # one transaction: all of it, or nothing held
            self.admission.try_admit(session_id)
            undo.callback(self.admission.release, session_id)
            sink = engine_sink(ENGINE_OUTPUT_BUFFER)
            try:
                handle = await driver.open_slot(session_id, sink, prompt=slot_prompt(config))
            except errors.PromptUnsupported as exc:  # no prompts, or a voice it does not have
                raise errors.UnsupportedParameter(str(exc), param="session.prompt") from exc
            if handle is None:  # a step changed the figures since the check above
                raise self._engine_refusal(driver.capacity())
            undo.callback(driver.detach, handle)
            try:
                vad = self._attach_vad(session_id, config)
            except errors.ResourceExhausted as exc:
                raise self._refusal(RefusalReason.VAD, str(exc)) from None
            if vad is not None:
                undo.callback(vad.link.close)
            agent = None
            if self.agent is not None:
                agent = AgentLink(self.agent, session_id, config.model_sample_rate)
            resources = SessionResources(driver, handle, sink, vad=vad, agent=agent)
            ref = await self.system.spawn(
                SessionActor,
                machine,
                resources,
                self,
                name=session_id,
                restart=Restart.TEMPORARY,
                lanes=SessionActor.lanes_for(config),
            )
            undo.pop_all()  # the session actor owns them now and releases them itself
        self._sessions[session_id] = ref
        self._placed[session_id] = index
        self._opened.inc()
        current = self.engines.get(index)
        if current is not None and current is not driver:  # it restarted meanwhile
            await ref.tell(EngineReplaced(current, "engine crashed"))
        if vad is not None and self.vad is not vad.link.streams:  # so did the VAD
            await ref.tell(VadReplaced(self.vad))  # type: ignore[arg-type]
        return Opened(session_id, ref)

    def released(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._placed.pop(session_id, None)
        self.admission.release(session_id)
        self._load_changed()

    def let_go(self, session_id: str) -> None:
        self._let_go.inc()

    def _load_changed(self) -> None:
        if self._on_load is not None:
            self._on_load()

    async def inspect(self, session_id: str) -> SessionMachine | None:
        """The live machine of a session (diagnostics and tests)."""
        ref = self._sessions.get(session_id)
        if ref is None:
            return None
        return await ref.ask(Inspect(), timeout=math.inf)
