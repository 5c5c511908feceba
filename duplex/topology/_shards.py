"""Session shards, seen from the server process: spawned, supervised, asked.

With ``server.session_shards = K`` (above 1) the server process is shard 0 and
runs K-1 shard processes (``_shard.py``), each a whole set of sessions with its
own engine and its part of ``max_sessions``. Each shard listens on a Unix socket
in a private folder; every connection worker connects to all of them, sends a
new session to the shard with the most room and a resume to the shard its
session id names (``duplex-s<shard>-...``). A shard that exits is restarted
after 1 s: its sessions are gone (a resume gets ``session_resume_expired``),
every other shard's are untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import trio

from duplex import __version__
from duplex.config import Config
from duplex.logs import get_logger
from duplex.metrics import Family, MetricsRegistry, Sample, merge_labelled

from ._capacity import merged_sessions
from ._children import ChildQueries, Children, child_args, spawn_linked
from ._link import Link, LinkBroken, Ready, ShardAnswer

MAX_SOCKET_PATH = 100
"""A Unix socket's path must fit ``sun_path`` (108 bytes on Linux, with its NUL)."""


class ShardProcesses:
    """Shards 1..K-1 of the server: their processes, sockets and control links.

    An async context manager for the private folder of the shards' sockets; ``run``
    starts and keeps the processes until ``stop``.
    """

    kind = "session shard"

    def __init__(
        self, config: Config, registry: MetricsRegistry, *, engine_paths: Sequence[str] = ()
    ) -> None:
        """``engine_paths``: the engine processes' sockets, which every shard links to."""
        self.config = config
        self.engine_paths = tuple(engine_paths)
        self.count = config.server.session_shards - 1
        self.folder = ""
        self.paths: tuple[str, ...] = ()
        self.log = get_logger(component="shards")
        grace = config.server.shutdown_grace_s
        restarts = None  # one shard: nothing to restart, nothing to export
        if self.count:
            restarts = registry.counter(
                "duplex_session_shard_restarts_total", "Session shards restarted after exiting"
            )
        # a stopping shard waits for its workers' graceful shutdown, then exits
        self.children = Children(
            self, range(1, self.count + 1), reap_after_s=2 * grace + 5, restarts=restarts
        )
        self.queries = ChildQueries(self.children)

    async def __aenter__(self) -> ShardProcesses:
        if self.count:
            self.folder = private_folder(f"shard-{self.count}.sock")
            self.paths = tuple(
                os.path.join(self.folder, f"shard-{i}.sock") for i in range(1, self.count + 1)
            )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    async def query(self, what: str) -> list[Any]:
        """Each shard's answer to ``what``, in shard order; ``None`` from a shard that is not
        serving (starting, restarting) or did not answer in time."""
        answers = await self.queries.ask(what)
        return [answers.get(index) for index in range(1, self.count + 1)]

    def sessions(self, healths: Sequence[dict[str, Any] | None]) -> dict[str, int]:
        """Every shard's health as the server's sessions: with engine processes the shards
        share their engines, each counted once (``_capacity.py``)."""
        return merged_sessions(healths, shared_engines=bool(self.engine_paths)).as_dict()

    async def health(self, own: dict[str, Any]) -> dict[str, Any]:
        """The server's ``/health``: each shard's (``own`` is shard 0's, this process's),
        and the sessions of them all. The server takes sessions while any shard does, so a
        restarting shard only degrades it; this process's own status (``starting``,
        ``sleeping``) is the server's."""
        shards = [{"shard": 0, **own}]
        for index, answer in enumerate(await self.query("health"), 1):
            shards.append({"shard": index, **(answer or {"status": "unavailable"})})
        status = "ok" if all(shard["status"] == "ok" for shard in shards) else "degraded"
        if own["status"] != "ok":
            status = own["status"]
        return {
            "status": status,
            "version": __version__,
            "model": own["model"],
            "sessions": self.sessions(shards),
            "shards": shards,
        }

    async def metrics(self, own: list[Family], own_health: dict[str, Any]) -> list[Family]:
        """The server's ``/metrics``: every shard's families under a ``shard`` label, and the
        whole server's sessions (`server_families`)."""
        parts = [({"shard": "0"}, own)]
        answers = await self.query("metrics")
        parts += [({"shard": str(i)}, a) for i, a in enumerate(answers, 1) if a is not None]
        sessions = self.sessions([own_health, *await self.query("health")])
        return [*merge_labelled(parts), *server_families(sessions)]

    async def spawn(self, index: int) -> tuple[trio.Process, Link]:
        args = [
            *child_args(self.config, index, self.paths[index - 1]),
            *(f"--engine-path={path}" for path in self.engine_paths),
        ]
        return await spawn_linked("duplex.topology._shard", args)

    async def serve(self, index: int, link: Link, on_ready: Callable[[], None]) -> None:
        try:
            async for message in link.messages():
                match message:
                    case Ready():
                        on_ready()
                    case ShardAnswer(request, value):
                        self.queries.answered(index, request, value)
        except LinkBroken as exc:
            self.log.error("session shard link broken", shard=index, error=str(exc))


def private_folder(longest: str) -> str:
    """A new folder only we can enter (mode 0700), short enough for ``longest`` inside it.

    Raises:
        RuntimeError: even under /tmp the path would not fit a Unix socket.
    """
    folder = tempfile.mkdtemp(prefix="duplex-shards-")
    if len(os.path.join(folder, longest)) <= MAX_SOCKET_PATH:
        return folder
    os.rmdir(folder)  # TMPDIR is too deep for socket paths: /tmp always fits
    folder = tempfile.mkdtemp(prefix="duplex-shards-", dir="/tmp")
    if len(os.path.join(folder, longest)) > MAX_SOCKET_PATH:
        os.rmdir(folder)
        raise RuntimeError(f"no folder short enough for the shards' Unix sockets: {folder}")
    return folder


def server_families(sessions: dict[str, int]) -> list[Family]:
    """The whole server's sessions (every shard, each engine once): per-shard gauges carry a
    ``shard`` label, and summing their capacity would count a shared engine per shard."""
    return [
        Family(
            f"duplex_server_sessions_{key}",
            "gauge",
            f"Sessions {key} over every session shard (each engine's slots counted once)",
            [Sample(f"duplex_server_sessions_{key}", {}, float(sessions[key]))],
        )
        for key in ("live", "capacity")
    ]
