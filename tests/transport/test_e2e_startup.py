"""/health while the engine is still being built: ``starting``, with what it waits for."""

from __future__ import annotations

import threading
from functools import partial

import httpx
import trio
from structlog.testing import capture_logs

from duplex.actors import open_actor_system
from duplex.config import load_config
from duplex.metrics import MetricsRegistry
from duplex.models import LoopbackRunner, ModelRunner, ModelSpec, register_model
from duplex.progress import note
from duplex.topology import serve_duplex

SPEC = ModelSpec("test-slow-start", max_slots=2)
RELEASE = threading.Event()


def _build(spec: ModelSpec) -> ModelRunner:
    note("loading weights (shard 2 of 3)")
    RELEASE.wait(30)
    return LoopbackRunner(spec)


register_model(SPEC, _build)


async def test_health_says_starting_with_what_it_waits_for_until_the_engine_runs() -> None:
    config = load_config(
        env={},
        overrides={
            "server.port": 0,
            "server.model": SPEC.name,
            "server.realtime_vad": "energy",
            "server.shutdown_grace_s": 0.5,
        },
    )
    registry = MetricsRegistry()
    with capture_logs() as logs:
        async with open_actor_system(registry=registry) as system, trio.open_nursery() as nursery:
            started = trio.Event()

            async def serve() -> None:
                await nursery.start(partial(serve_duplex, config, system, registry=registry))
                started.set()

            nursery.start_soon(serve)
            with trio.fail_after(10):  # the port is bound before the engine is built
                while not any(line["event"] == "listening" for line in logs):
                    await trio.sleep(0.01)
            (url,) = next(line["urls"] for line in logs if line["event"] == "listening")
            async with httpx.AsyncClient() as http:
                with trio.fail_after(10):  # until the factory's own note (it runs in a thread)
                    while True:
                        starting = await http.get(url + "/health")
                        assert starting.status_code == 503
                        body = starting.json()
                        assert body["status"] == "starting"
                        if body["waiting_for"]["engine"] != f"building model {SPEC.name}":
                            break
                        await trio.sleep(0.01)
                assert body["waiting_for"] == {"engine": "loading weights (shard 2 of 3)"}
                assert body["sessions"] == {"live": 0, "capacity": 0}
                assert not started.is_set()  # no `started` line, no reported binds yet
                RELEASE.set()
                with trio.fail_after(10):
                    await started.wait()
                ready = await http.get(url + "/health")
            assert ready.status_code == 200
            assert ready.json()["status"] == "ok" and "waiting_for" not in ready.json()
            system.request_shutdown()
    events = [line["event"] for line in logs]
    assert events.index("listening") < events.index("engine started") < events.index("started")
