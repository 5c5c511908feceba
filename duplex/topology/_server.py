"""Server assembly: actor system, engine, shared VAD engine, hub and hypercorn in one trio process.

With ``server.connection_workers`` the WebSocket I/O moves to worker processes
(``_workers.py``); with ``server.session_shards`` too, sessions (each shard with
its own engine) are spread over this process and shard processes (``_shards.py``).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.utils import repr_socket_addr

from duplex.actors import ActorRef, ActorSystem, open_actor_system, run_until_signal, unwrap
from duplex.config import Config, api_keys_of, is_loopback
from duplex.exceptions import ConfigError
from duplex.logs import configure_logging, get_logger
from duplex.metrics import REGISTRY, MetricsRegistry
from duplex.models import (
    Engine,
    EngineActor,
    EngineDriver,
    EngineRecorder,
    ModelOptions,
    ModelSpec,
    RunnerFactory,
    Slack,
    get_model,
    policy_factory,
    silero_engine,
)
from duplex.models.agent import AgentModels, AgentOptions, build_replier, reply_capabilities
from duplex.progress import Startup, TerminalBar, render_line
from duplex.runtime import RequestEngines, SessionHub
from duplex.services.chat import ChatService, chat_modalities
from duplex.services.media import MediaService
from duplex.services.omni import OmniService
from duplex.services.robots import RobotService
from duplex.services.speech import SpeechService, UploadedVoices
from duplex.services.videochat import VideoChatService
from duplex.services.voices import VoiceService
from duplex.sessions import Capabilities, SessionConfig, VadMode
from duplex.transport import (
    AccessSettings,
    HubBackend,
    ResumeGuard,
    build_app,
    digest,
    hypercorn_config,
    raise_fd_limit,
    routes_app,
    serve_http,
)
from duplex.wire import MAX_PAYLOAD_BYTES

from . import _link
from ._children import Children
from ._deadline import EXIT_MARGIN_S, ExitDeadline
from ._engine_client import EngineConnection, engine_spec, export_engine_histograms
from ._engines import EngineProcesses
from ._layout import available_cores, resolve_layout
from ._loop_lag import export_loop_lag, watch_loop_lag
from ._media import open_media
from ._memory import export_trim_histogram, trim_memory_every
from ._requests import model_cards, open_request_engines, runner_specs
from ._routes import robot_limits, service_routes
from ._shards import ShardProcesses
from ._sleep import LocalEngineSleep, ProcessEngineSleep
from ._voices import voice_folder, voice_store
from ._watchdog import EngineWatchdog
from ._workers import ConnectionWorkers, LinkServer, WorkerSettings, worker_access


def resolve_model(config: Config) -> tuple[ModelSpec, RunnerFactory]:
    """The configured model, checked against the session config.

    Raises:
        UnknownModel: no such model.
        ConfigError: the session's model rate is not the model's, a model device is
            invalid or absent (``cuda`` where torch finds no CUDA device, for any model),
            or a named checkpoint folder is missing (one line naming what).
    """
    engine = config.engine
    for device in engine.devices:
        if device != "cpu":
            check_cuda_device(device)
    options = ModelOptions(
        device=engine.devices[0],
        seed=engine.model_seed,
        kv_cache_dtype=engine.kv_cache_dtype,
        weight_dtype=engine.weight_dtype,
        codec_dtype=engine.codec_dtype,
        cache_dir=Path(engine.model_cache_dir).expanduser() if engine.model_cache_dir else None,
        loopback_delay_ms=engine.loopback_delay_ms,
        random_weights=engine.random_weights,
        voice_dir=voice_folder(config),
    )
    spec, factory = get_model(engine.model, options)
    check_model_rate(config, spec)
    return spec, factory


def check_model_rate(config: Config, spec: ModelSpec) -> None:
    """Raises ConfigError: the session's model rate is not the model's."""
    if config.session.model_sample_rate != spec.sample_rate:
        raise ConfigError(
            f"session.model_sample_rate: {config.session.model_sample_rate} does not match "
            f"model {spec.name!r}, which runs at {spec.sample_rate} Hz"
        )


def resolve_policy(config: Config) -> None:
    """Check ``policy.model`` before serving: a ``module:factory`` imports and is callable.

    Raises:
        ConfigError: it does not (one line naming what).
    """
    name = config.policy.model
    if name not in ("reference", "none"):
        policy_factory(name)


def check_cuda_device(device: str) -> None:
    """Refuse a ``cuda`` or ``cuda:N`` model device that torch cannot see.

    Raises:
        ConfigError: no CUDA device at all, or fewer than ``N + 1``.
    """
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"engine.model_device: {device!r}, but torch finds no CUDA device on this machine "
            "(use cpu)"
        )
    index = int(device.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(
            f"engine.model_device: {device!r}, but torch finds {count} CUDA device(s) "
            f"(0..{count - 1})"
        )


def capabilities_for(spec: ModelSpec) -> Capabilities:
    """What sessions may use, from the model's spec."""
    return Capabilities(
        supports_video_input=spec.supports_video_input,
        supports_model_native_turn_policy=spec.supports_model_native_turn_policy,
        supports_prompts=spec.supports_prompts,
        chunk_period_ms=int(spec.frame_ms),
    )


VAD_MAX_PENDING_MS = 4096
"""Unscored audio one VAD stream may queue before further windows are refused (counted). A
client may send faster than real time (a file, a reconnect's backlog); the driver catches
up at 8 windows a tick (8x real time). 4 s is 256 KiB a stream, 64 MiB if all 256 burst.
A window that finds the queue full is refused (the engine's overflow policy): the stream's
clock keeps it as a gap, which the segmenter takes as silence."""


def uses_silero(config: Config) -> bool:
    """Some session may run on the shared silero VAD (Realtime turn-based or ``session.vad``)."""
    silero = VadMode.SILERO
    return config.engine.realtime_vad == silero.value or config.session.vad is silero


def limit_torch_threads() -> None:
    """One intra-op torch thread for the process; called at server startup, when the VAD runs.

    The VAD's forward is small matrix products (at most ``vad_streams`` x 128);
    more threads only contend with the trio thread and the engine's thread. On a
    2-core machine, 256 streams took 11-15 ms per 32 ms step with 1 thread and
    had a p90 of 40-60 ms with 2 under load (``bench/vad.py``). It is process-wide,
    so it is set here, at startup, and never by importing a library (the
    ``silero_vad`` package would do it on import; we read its weights instead).
    """
    import torch

    torch.set_num_threads(1)


def freeze_startup_objects() -> None:
    """Move everything built so far out of the cyclic collector's sight (``gc.freeze``).

    torch, the model and the VAD bring about 140,000 long-lived tracked objects;
    every full collection walked them all, a 50-120 ms pause of the event loop on
    a 2-core machine, which made whole engine ticks late (docs/benchmarks.md).
    Frozen objects are never collected, so this runs once, after the engine and
    the VAD are built and their garbage is collected; `unfreeze_startup_objects`
    undoes it on the way out.

    The second collection walks almost nothing (all is frozen) and resets the
    collector's count of long-lived objects, which the first one set to everything
    built so far: CPython runs a full collection only once the objects that reached
    the oldest generation since number a quarter of that count, so with torch's
    ~200,000 the first one could wait until ~50,000 had piled up, among them closed
    sessions and connections, which are reference cycles holding their audio
    (docs/reliability.md, "Soak").
    """
    gc.collect()
    gc.freeze()
    gc.collect()


def unfreeze_startup_objects() -> None:
    """Hand the frozen objects back to the collector when the server stops.

    Frozen objects are skipped by the collections of interpreter shutdown too, so
    the cycles among extension types stay alive past it: nanobind then reports
    Triton's types, functions and instances as leaked (dozens of ``nanobind:
    leaked ...`` lines at exit, once the Triton kernels were imported).
    """
    gc.unfreeze()


def access_settings(config: Config) -> AccessSettings:
    """The access policy's settings: keys as digests, the bind's loopbackness, the lists.

    Raises:
        ConfigError: ``api_key_file`` cannot be read or holds a bad key; a TLS file is missing.
    """
    access = config.access
    return AccessSettings(
        key_digests=tuple(digest(key) for key in api_keys_of(access)),
        loopback=is_loopback(config.server.host),
        allowed_origins=access.allowed_origins,
        allowed_hosts=access.allowed_hosts,
        failure_burst=access.auth_failure_burst,
        failure_window_s=access.auth_failure_window_s,
        max_connections_per_peer=access.max_connections_per_peer,
        body_timeout_s=config.server.http_body_timeout_s,
    )


def shard_max_sessions(max_sessions: int, shards: int, index: int) -> int:
    """Shard ``index``'s part of ``max_sessions`` (0, no cap, stays 0): the parts sum to it."""
    if not max_sessions:
        return 0
    return max_sessions // shards + (1 if index < max_sessions % shards else 0)


SERVER_DEAD_LETTERS = 0
"""Dead letters a server's actor system keeps for inspection: none. Each kept message keeps
alive all it references, and an engine output sent to a session that just closed references
the whole session (its sink, its actor, its machine with journal and history): with the
default 1000, closed sessions piled up in memory under churn (docs/reliability.md). They
are still counted (``duplex_dead_letters_total``) and logged at debug."""

STARTUP_LOG_INTERVAL_S = 5.0
"""While the engine or the VAD is still starting, one ``still starting`` line this often."""


BAR_REDRAW_S = 0.25
"""How often the startup bar on a terminal is redrawn."""


async def log_startup_progress(
    startup: Startup, interval_s: float = STARTUP_LOG_INTERVAL_S, *, bar: bool | None = None
) -> None:
    """Until the startup is done: on a terminal (``bar``; ``None``: when stderr is one) a
    status line redrawn in place (`TerminalBar`), else one ``still starting`` line (what
    it waits for, seconds so far) each ``interval_s``."""
    if bar is None:
        bar = sys.stderr.isatty()
    if bar:
        with TerminalBar(sys.stderr) as terminal:
            frame = 0
            while True:
                await trio.sleep(BAR_REDRAW_S)  # a quick start draws nothing
                if startup.done:
                    return
                terminal.draw(render_line(startup, terminal.width(), frame))
                frame += 1
    log = get_logger(component="server")
    while True:
        await trio.sleep(interval_s)
        if startup.done:
            return
        log.info(
            "still starting",
            waiting_for=startup.waiting_for(),
            elapsed_s=round(startup.elapsed(), 1),
        )


@asynccontextmanager
async def open_backend(
    config: Config,
    system: ActorSystem,
    registry: MetricsRegistry,
    *,
    shard: int | None = None,
    engine_paths: Sequence[str] = (),
    startup: Startup | None = None,
    slack: Slack | None = None,
    requests: RequestEngines | None = None,
    sleep: LocalEngineSleep | None = None,
) -> AsyncIterator[HubBackend]:
    """This process's sessions: hub, engine (or links to engine processes) and shared VAD,
    stopped on the way out. ``sleep``: told the engine actor this process spawns, so
    ``POST /v1/omni/sleep`` can stop it and wake it again.

    ``shard``: the process's index when the server runs several session shards.
    ``engine_paths``: the sockets of the engine processes, one per device (already
    listening: their greeting gives the model's spec); empty: the engine runs here.
    The backend is yielded at once, while the engine (or the links to the engine
    processes) and the VAD start in the background as ``startup`` steps: its ``/health``
    says ``starting`` with what it waits for, sessions are refused (``starting``)
    meanwhile, and ``backend.ready`` is set once all run. A failed start ends the block
    with its error. ``slack``: the process's windows between ticks, opened and closed by
    an engine that runs here, shared with the request engines of this process.
    ``requests``: where the links to engine processes register the request engines those
    processes host (``None``: this process uses none of them).
    """
    session_cfg = config.session
    server, engine, access = config.server, config.engine, config.access
    if engine_paths:  # the engine processes own the model: its spec comes from them
        specs = [await engine_spec(path) for path in engine_paths]
        spec = specs[0]
        check_model_rate(config, spec)
        factory = None
    else:
        spec, factory = resolve_model(config)
    max_sessions = engine.max_sessions
    if shard is not None:
        max_sessions = shard_max_sessions(max_sessions, server.session_shards, shard)
    agent = config.agent.enabled and requests is not None
    reply = reply_capabilities(config.agent.llm)  # the agent's reply model answers turns
    hub_spec = spec
    if engine_paths:  # the hub's slot pool is every engine's
        hub_spec = dataclasses.replace(spec, max_slots=sum(s.max_slots for s in specs))
    hub = SessionHub(
        system,
        hub_spec,
        config=session_cfg,
        capabilities=dataclasses.replace(
            capabilities_for(spec),
            agent_cascade=agent,
            reply_tools=agent and reply.tools,
            reply_instructions=agent and reply.instructions,
        ),
        max_sessions=max_sessions,
        registry=registry,
        shard=shard,
        node=server.node_name or None,
        export_engine_metrics=not engine_paths or not shard,  # one engine, exported once
    )
    startup = startup if startup is not None else Startup()
    guard = ResumeGuard(burst=access.auth_failure_burst, window_s=access.auth_failure_window_s)
    backend = HubBackend(
        hub,
        registry,
        first_event_timeout_s=server.first_event_timeout_s,
        resume_guard=guard,
        startup=startup,
        chat_wait_queue=engine.chat_wait_queue,
        more_models=None
        if requests is None
        else partial(
            model_cards,
            config,
            requests,
            lambda: hub.agent.metadata["llm"] if hub.agent else None,
            lambda: chat_modalities(hub.agent.chat if hub.agent else None),
        ),
    )
    refs: list[ActorRef[Any]] = []
    frozen = False
    log = get_logger(component="server")

    async def start(nursery: trio.Nursery) -> None:
        nonlocal frozen
        if engine_paths:
            export_engine_histograms(registry, spec.name, hub)
            with startup.step("engine", f"linking to {len(engine_paths)} engine process(es)"):
                connections = [
                    EngineConnection(spec, index, path, hub, requests)
                    for index, path in enumerate(engine_paths)
                ]
                for connection in connections:
                    nursery.start_soon(connection.run)
                for connection in connections:
                    await connection.ready.wait()
        else:
            assert factory is not None
            recorder = EngineRecorder(spec.name, spec.max_slots, registry)
            build = partial(build_engine, spec, factory, session_cfg, recorder, slack)

            async def spawn_engine() -> ActorRef[Any]:
                return await system.spawn(
                    EngineActor,
                    build,
                    hub.engine_started,
                    trio.to_thread.run_sync,
                    name=f"engine-{spec.name}",
                )

            with startup.step("engine", f"building model {spec.name}"):
                refs.append(await spawn_engine())
            if sleep is not None and not shard:
                sleep.attach(hub, refs, refs[-1], spawn_engine)
            took = round(startup.finished["engine"], 2)
            log.info("engine started", model=spec.name, took_s=took)
        if uses_silero(config):
            with startup.step("vad", "importing torch for the silero VAD"):
                # seconds on a small machine: off the event loop, so /health answers meanwhile
                await trio.to_thread.run_sync(importlib.import_module, "torch")
            limit_torch_threads()
            streams = engine.vad_streams

            def build_vad() -> EngineDriver:
                engine = silero_engine(streams, max_pending_ms=VAD_MAX_PENDING_MS)
                return EngineDriver(engine)

            with startup.step("vad", "loading the silero VAD"):
                refs.append(
                    await system.spawn(EngineActor, build_vad, hub.vad_started, name="vad-silero")
                )
        agent = config.agent
        if agent.enabled and requests is not None:  # (session shards have no request engines)
            options = AgentOptions(llm=agent.llm, seed=engine.model_seed)
            with startup.step("agent", "loading the agent's reply model"):
                replier, chat = await trio.to_thread.run_sync(build_replier, options)
                await nursery.start(replier.run)
            hub.agent_started(AgentModels(requests, replier, chat))
            log.info("agent started", llm=agent.llm or "echo", asr=agent.asr)
        freeze_startup_objects()
        frozen = True
        export_trim_histogram(registry, hub)
        nursery.start_soon(trim_memory_every, server.malloc_trim_interval_s, slack)
        nursery.start_soon(watch_loop_lag, export_loop_lag(registry))
        backend.ready.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start, nursery)
            # one bar per terminal: the first session process draws it, shards log lines
            bar = None if not shard else False
            nursery.start_soon(partial(log_startup_progress, startup, bar=bar))
            yield backend
            nursery.cancel_scope.cancel()  # a stop before the start finished, and the links
    finally:
        with trio.CancelScope(shield=True):
            for ref in reversed(refs):  # the VAD, then the engine
                await system.stop(ref)
        if frozen:
            unfreeze_startup_objects()


def build_engine(
    spec: ModelSpec,
    factory: RunnerFactory,
    session: SessionConfig,
    recorder: EngineRecorder | None = None,
    slack: Slack | None = None,
) -> EngineDriver:
    """A fresh engine and its driver (loads the model: seconds for a 7B checkpoint)."""
    engine = Engine(
        factory(spec),
        max_input_frames=session.max_pending_input_bytes // (spec.frame_samples * 2) + 2,
        max_video_frames=session.video_lane_size,
        recorder=recorder,
    )
    return EngineDriver(engine, recorder=recorder, slack=slack)


def robot_service(
    config: Config,
    system: ActorSystem,
    registry: MetricsRegistry,
    backend: HubBackend,
    requests: RequestEngines,
) -> RobotService | None:
    """The robot endpoint's service over the process's request engines (the policy is the
    one named ``policy``); ``None``: no policy is served (``policy.model = "none"``).
    With connection workers it runs here too: they relay robot sockets whole."""
    if config.policy.model == "none":
        return None
    return RobotService(
        system,
        backend.connections,
        requests,
        registry,
        idle_timeout_s=config.policy.idle_timeout_s,
        max_payload_bytes=MAX_PAYLOAD_BYTES,
    )


def speech_service(
    config: Config,
    registry: MetricsRegistry,
    requests: RequestEngines,
    uploaded: UploadedVoices | None = None,
) -> SpeechService:
    """The speech routes' service over the process's request engines (the TTS is the one
    named ``tts``, the engine the voice agent speaks with too). With connection workers it
    serves the routes they relay here (``_relay.py``). ``uploaded``: the uploaded voices,
    which the TTS refuses by name (it cannot condition on a sample)."""
    return SpeechService(
        requests, registry, uploaded=uploaded, max_audio_s=config.speech.max_audio_s
    )


async def serve_duplex(
    config: Config,
    system: ActorSystem,
    *,
    registry: MetricsRegistry = REGISTRY,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run engine and HTTP server until ``system.request_shutdown()``; reports the binds once
    sessions can be admitted.

    Engine processes, when they run, are built and listening first. Then the port is
    bound: ``/health`` answers ``starting`` (with what it waits for) while an in-process
    engine and the VAD start; the ``started`` line follows when they run.
    """
    access = access_settings(config)
    async with EngineProcesses(config, registry) as engines, trio.open_nursery() as nursery:
        if engines.devices:  # built and listening before any session process links to them
            await nursery.start(engines.children.run)
        try:
            slots = sum([(await engine_spec(path)).max_slots for path in engines.paths])
            config, chosen = resolve_layout(config, slots=slots, cores=available_cores())
            get_logger(component="server").info(
                "layout",
                connection_workers=chosen.connection_workers,
                session_shards=chosen.session_shards,
                reason=chosen.reason,
            )
            await _serve_sessions(
                config,
                system,
                registry,
                access,
                engines.paths,
                engines.children,
                task_status=task_status,
            )
        finally:
            engines.children.stop()
    get_logger(component="server").info("stopped")


async def _serve_sessions(
    config: Config,
    system: ActorSystem,
    registry: MetricsRegistry,
    access: AccessSettings,
    engine_paths: Sequence[str],
    engine_processes: Children | None = None,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """This process's sessions and the HTTP server (with workers and shards, if any);
    ``engine_processes`` (with ``engine_paths``): what the engine watchdog kills."""
    log = get_logger(component="server")
    server = config.server
    sharded = server.session_shards > 1
    slack = Slack()  # realtime ticks first: request engines here run in what they leave
    local = not engine_paths
    if sharded and config.agent.enabled and local:
        log.warning(
            "the voice agent answers only the server process's sessions: session shards "
            "reach its engines through engine processes (engine_process = on); the others "
            "answer with the turn responder",
            session_shards=server.session_shards,
        )
    if local and runner_specs(config) and config.engine.devices[0] == "cpu":
        limit_torch_threads()  # a model on the CPU shares the cores with the event loop
    # an in-process engine beside shards cannot sleep (each shard has its own): 501
    local_sleep = LocalEngineSleep(system)
    async with (
        open_request_engines(config, system, registry, slack, local=local) as requests,
        open_backend(
            config,
            system,
            registry,
            shard=0 if sharded else None,
            engine_paths=engine_paths,
            slack=slack,
            requests=requests,
            sleep=local_sleep if local and not sharded else None,
        ) as backend,
        open_media(config, registry, requests) as media,
    ):
        robots = robot_service(config, system, registry, backend, requests)
        store = voice_store(config)
        speech = speech_service(config, registry, requests, store)
        voices = VoiceService(store, speech, registry=registry)
        sleeper: LocalEngineSleep | ProcessEngineSleep = local_sleep
        if engine_processes is not None and engine_paths:
            sleeper = ProcessEngineSleep(backend.hub, engine_processes)
        omni = OmniService(sleeper)
        hub = backend.hub
        chat = ChatService(
            lambda: hub.agent.chat if hub.agent else None,
            configured=config.agent.enabled and bool(config.agent.llm),
            registry=registry,
            max_choices=config.agent.chat_max_choices,
        )
        video_chat = VideoChatService(
            lambda: hub.agent.chat if hub.agent else None,
            lambda: hub.agent.speak if hub.agent else None,
            configured=config.agent.enabled and bool(config.agent.llm),
            registry=registry,
        )
        # the grace is split: half for every socket to close (1001, in parallel), half for
        # hypercorn to let the rest finish before it aborts them (a peer that reads nothing)
        robot_payload_bytes = MAX_PAYLOAD_BYTES if robots is not None else 0
        hyper = hypercorn_config(
            f"{server.host}:{server.port}",
            max_frame_bytes=server.max_frame_bytes,
            graceful_timeout_s=server.shutdown_grace_s / 2,
            tls_certfile=config.access.tls_certfile,
            tls_keyfile=config.access.tls_keyfile,
            message_limits=robot_limits(robot_payload_bytes),
        )
        async with trio.open_nursery() as nursery:
            if server.connection_workers:
                relayed = routes_app(
                    service_routes(
                        media,
                        speech,
                        robots,
                        registry=registry,
                        chat=chat,
                        video_chat=video_chat,
                        voices=voices,
                        omni=omni,
                    )
                )
                urls = await nursery.start(
                    partial(
                        serve_with_workers,
                        config,
                        backend,
                        hyper,
                        registry,
                        access,
                        engine_paths,
                        relayed,
                        robot_payload_bytes=robot_payload_bytes,
                        on_shards=(
                            sleeper.attach_shards
                            if isinstance(sleeper, ProcessEngineSleep)
                            else None
                        ),
                    )
                )
            else:
                urls = await nursery.start(
                    _serve_here,
                    config,
                    system,
                    backend,
                    hyper,
                    registry,
                    access,
                    robots,
                    media,
                    speech,
                    chat,
                    video_chat,
                    voices,
                    omni,
                )
            await backend.ready.wait()
            stall_timeout_s = config.engine.stall_timeout_s
            if engine_paths and engine_processes is not None and stall_timeout_s:
                watchdog = EngineWatchdog(
                    backend.hub,
                    engine_processes,
                    stall_timeout_s,
                    registry.counter(
                        "duplex_engine_stall_kills_total",
                        "Engine processes killed by the watchdog: live slots and no tick "
                        "for engine.stall_timeout_s",
                    ),
                )
                nursery.start_soon(_until_shutdown, system, watchdog.run)
            # after the bind: a port already taken ends the server with one clear line
            log.info(
                "started",
                urls=urls,
                tls=bool(config.access.tls_certfile),
                api_keys=len(access.key_digests),
                model=backend.hub.spec.name,
                vad="silero" if uses_silero(config) else None,
                connection_workers=server.connection_workers,
                session_shards=server.session_shards,
                engine_processes=len(engine_paths),
                startup_s=round(backend.startup.elapsed(), 2) if backend.startup else None,
                policy=config.policy.model if robots is not None else None,
                tts=config.speech.tts if config.speech.tts != "none" else None,
            )
            task_status.started(urls)


async def _until_shutdown(system: ActorSystem, fn: Callable[[], Awaitable[None]]) -> None:
    """``fn()`` until the server is asked to stop (then the HTTP server winds down)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fn)
        await system.wait_shutdown_requested()
        nursery.cancel_scope.cancel()


async def _serve_here(
    config: Config,
    system: ActorSystem,
    backend: HubBackend,
    hyper: HypercornConfig,
    registry: MetricsRegistry,
    access: AccessSettings,
    robots: RobotService | None = None,
    media: MediaService | None = None,
    speech: SpeechService | None = None,
    chat: ChatService | None = None,
    video_chat: VideoChatService | None = None,
    voices: VoiceService | None = None,
    omni: OmniService | None = None,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve HTTP and WebSockets in this process (no connection workers); reports the binds."""
    server = config.server
    app = build_app(
        backend,
        max_frame_bytes=server.max_frame_bytes,
        realtime_vad=config.engine.realtime_vad,
        realtime_agent=config.agent.enabled,
        access=access,
        client_secret_ttl_s=config.access.client_secret_ttl_s,
        registry=registry,
        routes=service_routes(
            media,
            speech,
            robots,
            registry=registry,
            chat=chat,
            video_chat=video_chat,
            voices=voices,
            omni=omni,
        ),
    )

    async def shutdown_trigger() -> None:
        await system.wait_shutdown_requested()
        await backend.connections.close_all(server.shutdown_grace_s / 2)  # 1001, at once

    # hypercorn returns after its graceful shutdown; then the engine stops
    await serve_http(
        app,
        hyper,
        shutdown_trigger=shutdown_trigger,
        registry=registry,
        max_connections=server.max_connections,
        task_status=task_status,
    )


async def serve_with_workers(
    config: Config,
    backend: HubBackend,
    hyper: HypercornConfig,
    registry: MetricsRegistry,
    access: AccessSettings,
    engine_paths: Sequence[str] = (),
    relayed: Any | None = None,
    *,
    robot_payload_bytes: int = 0,
    on_shards: Callable[[ShardProcesses], None] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind here, serve in connection workers (and shards); returns once all have exited.

    ``relayed``: the app of the routes the workers relay whole to this process
    (``_relay.py``: speech, images, videos, robots); ``robot_payload_bytes``: the robot
    endpoint's frame limit when a policy is served (the workers' sockets allow it);
    ``on_shards``: told the shards once they run (the engine processes' sleep asks them).

    Shards start first, so each worker finds every shard's socket when it starts.
    On shutdown this process's sockets close (1001), then every shard closes its
    own, then the workers stop once their sockets are closed.
    """
    server = config.server
    sockets = hyper.create_sockets()
    (listener,) = sockets.secure_sockets or sockets.insecure_sockets  # TLS: the workers speak it
    try:
        listener.listen(hyper.backlog)
        links = LinkServer(backend, registry, relayed)
        shard_processes = ShardProcesses(config, registry, engine_paths=engine_paths)
        async with shard_processes as shards, trio.open_nursery() as nursery:
            if shards.count:
                await nursery.start(shards.children.run)
                backend.attach_shards(shards)
                if on_shards is not None:
                    on_shards(shards)
            settings = WorkerSettings(
                server,
                fingerprint=_link.CODE_FINGERPRINT,
                realtime_vad=config.engine.realtime_vad,
                agent=config.agent.enabled,
                shard_paths=shards.paths,
                access=worker_access(access, server.connection_workers),
                client_secret_ttl_s=config.access.client_secret_ttl_s,
                tls_certfile=config.access.tls_certfile,
                tls_keyfile=config.access.tls_keyfile,
                robot_payload_bytes=robot_payload_bytes,
            )
            workers = ConnectionWorkers(
                links, listener, server.connection_workers, settings, registry
            )
            backend.attach_workers(workers)
            await nursery.start(workers.children.run)
            bind = repr_socket_addr(listener.family, listener.getsockname())
            scheme = "https" if config.access.tls_certfile else "http"
            get_logger(component="http").info("listening", urls=[f"{scheme}://{bind}"])
            task_status.started([f"{scheme}://{bind}"])
            await backend.hub.system.wait_shutdown_requested()
            await backend.connections.close_all(server.shutdown_grace_s / 2)  # 1001, at once
            shards.children.stop()  # each shard closes its sockets, then waits for the workers
            workers.children.stop()
    finally:
        listener.close()


def run_server(config: Config) -> int:
    """Blocking entry point of ``duplex serve``; returns the process exit code."""
    configure_logging(config.server.log_format, config.server.log_level)

    async def main() -> None:
        async with (
            open_actor_system(name="duplex", dead_letter_capacity=SERVER_DEAD_LETTERS) as system,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(serve_duplex, config, system)
            await run_until_signal(system)
            grace = config.server.shutdown_grace_s
            deadline.arm(grace + EXIT_MARGIN_S)  # whatever still runs then, the process exits
            nursery.cancel_scope.deadline = trio.current_time() + grace + 1

    raise_fd_limit()
    deadline = ExitDeadline()
    failure: BaseException | None = None
    try:
        trio.run(main)
    except* OSError as group:  # e.g. the port is taken: say so in one line
        failure = unwrap(group)
    finally:
        deadline.disarm()
    if failure is None and deadline.armed:
        deadline.exit_now(0)  # a shutdown was asked for and is done
    if failure is not None:
        server = config.server
        print(f"duplex: cannot serve on {server.host}:{server.port}: {failure}", file=sys.stderr)
        return 1
    return 0
