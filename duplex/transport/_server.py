"""Server assembly: actor system, engine, hub and hypercorn in one trio process."""

from __future__ import annotations

import sys

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from duplex.actors import ActorSystem, open_actor_system, run_until_signal
from duplex.actors._supervisor import unwrap
from duplex.config import Config
from duplex.exceptions import ConfigError
from duplex.logs import configure_logging, get_logger
from duplex.metrics import REGISTRY, MetricsRegistry
from duplex.models import (
    Engine,
    EngineActor,
    EngineDriver,
    ModelSpec,
    RunnerFactory,
    get_model,
)
from duplex.sessions import Capabilities
from duplex.sessions._hub import SessionHub

from ._app import Connections, build_app


def resolve_model(config: Config) -> tuple[ModelSpec, RunnerFactory]:
    """The configured model, checked against the session config.

    Raises:
        UnknownModel: no such model.
        ConfigError: the session's model rate is not the model's.
    """
    spec, factory = get_model(config.server.model)
    if config.session.model_sample_rate != spec.sample_rate:
        raise ConfigError(
            f"session.model_sample_rate: {config.session.model_sample_rate} does not match "
            f"model {spec.name!r}, which runs at {spec.sample_rate} Hz"
        )
    return spec, factory


def capabilities_for(spec: ModelSpec) -> Capabilities:
    """What sessions may use, from the model's spec."""
    return Capabilities(
        supports_video_input=spec.supports_video_input,
        supports_model_native_turn_policy=spec.supports_model_native_turn_policy,
        chunk_period_ms=int(spec.frame_ms),
    )


async def serve_duplex(
    config: Config,
    system: ActorSystem,
    *,
    registry: MetricsRegistry = REGISTRY,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run engine and HTTP server until ``system.request_shutdown()``; reports the binds."""
    log = get_logger(component="server")
    spec, factory = resolve_model(config)
    session_cfg = config.session
    frame_bytes = spec.frame_samples * 2
    hub = SessionHub(
        system,
        spec,
        config=session_cfg,
        capabilities=capabilities_for(spec),
        max_sessions=config.server.max_sessions,
        registry=registry,
    )

    def build_engine() -> EngineDriver:
        engine = Engine(
            factory(spec),
            max_input_frames=session_cfg.max_pending_input_bytes // frame_bytes + 2,
            max_video_frames=session_cfg.video_lane_size,
        )
        return EngineDriver(engine)

    engine_ref = await system.spawn(
        EngineActor, build_engine, hub.engine_started, name=f"engine-{spec.name}"
    )
    connections = Connections(system)
    app = build_app(
        hub, connections, registry=registry, max_frame_bytes=config.server.max_frame_bytes
    )

    async def shutdown_trigger() -> None:
        await system.wait_shutdown_requested()
        await connections.close_all()  # each socket closes with 1001 before hypercorn drains

    hyper = HypercornConfig()
    hyper.bind = [f"{config.server.host}:{config.server.port}"]
    hyper.websocket_max_message_size = 2 * config.server.max_frame_bytes
    hyper.graceful_timeout = config.server.shutdown_grace_s
    hyper.accesslog = None
    hyper.errorlog = None
    log.info("starting", bind=hyper.bind, model=spec.name)
    try:
        # hypercorn returns after its graceful shutdown; then the engine stops
        await serve(app, hyper, shutdown_trigger=shutdown_trigger, task_status=task_status)
    finally:
        with trio.CancelScope(shield=True):
            await system.stop(engine_ref)
    log.info("stopped")


def run_server(config: Config) -> int:
    """Blocking entry point of ``duplex serve``; returns the process exit code."""
    configure_logging(config.server.log_format, config.server.log_level)

    async def main() -> None:
        async with open_actor_system(name="duplex") as system, trio.open_nursery() as nursery:
            nursery.start_soon(serve_duplex, config, system)
            await run_until_signal(system)
            nursery.cancel_scope.deadline = trio.current_time() + config.server.shutdown_grace_s + 1

    failure: BaseException | None = None
    try:
        trio.run(main)
    except* OSError as group:  # e.g. the port is taken: say so in one line
        failure = unwrap(group)
    if failure is not None:
        server = config.server
        print(f"duplex: cannot serve on {server.host}:{server.port}: {failure}", file=sys.stderr)
        return 1
    return 0
