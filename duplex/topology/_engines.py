"""Engine processes, seen from the server process: one per device, spawned and supervised.

With engines in their own processes (``server.engine_process``), the server
runs one engine process per device of ``model_device`` (``_engine_process.py``),
each listening on a Unix socket in a private folder. Every session process (the
server itself, and each session shard) links to every engine. An engine process
that exits is restarted after 1 s; its session processes reconnect and move
their sessions onto the new engine (they are told ``engine_error``); sessions on
other engines are untouched.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from types import TracebackType

import trio

from duplex.config import Config
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry

from ._children import Children, child_args, spawn_linked
from ._link import Link, LinkBroken, Ready
from ._shards import private_folder

ENGINE_BUILD_S = 600.0
"""How long a stopping engine process may take to exit (it may be mid-load of a 7B model)."""


class EngineProcesses:
    """The server's engine processes: an async context manager for their sockets' folder;
    ``children.run`` starts them and reports once every engine is built and listening."""

    kind = "engine process"

    def __init__(self, config: Config, registry: MetricsRegistry) -> None:
        self.config = config
        self.devices = config.engine.devices if config.engine_processes else ()
        self.folder = ""
        self.paths: tuple[str, ...] = ()
        self.log = get_logger(component="engines")
        restarts = None
        if self.devices:
            restarts = registry.counter(
                "duplex_engine_process_restarts_total", "Engine processes restarted after exiting"
            )
        grace = config.server.shutdown_grace_s
        self.children = Children(
            self, range(len(self.devices)), reap_after_s=grace + 5, restarts=restarts
        )

    async def __aenter__(self) -> EngineProcesses:
        if self.devices:
            self.folder = private_folder(f"engine-{len(self.devices)}.sock")
            self.paths = tuple(
                os.path.join(self.folder, f"engine-{i}.sock") for i in range(len(self.devices))
            )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    async def spawn(self, index: int) -> tuple[trio.Process, Link]:
        args = [
            *child_args(self.config, index, self.paths[index]),
            f"--device={self.devices[index]}",
        ]
        return await spawn_linked("duplex.topology._engine_process", args)

    async def serve(self, index: int, link: Link, on_ready: Callable[[], None]) -> None:
        try:
            async for message in link.messages():
                if isinstance(message, Ready):
                    on_ready()
        except LinkBroken as exc:
            self.log.error("engine process link broken", engine=index, error=str(exc))
