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

import base64
import os
import pickle
import re
import shutil
import socket
import sys
import tempfile
from types import TracebackType
from typing import Any

import trio

from duplex.config import Config
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry

from ._link import (
    CODE_FINGERPRINT,
    EXIT_STALE_CODE,
    Link,
    LinkBroken,
    Ready,
    ShardAnswer,
    ShardQuery,
    Stop,
)

RESTART_DELAY_S = 1.0
"""Pause before a dead shard's replacement starts, so a crash loop cannot spin a core."""

QUERY_TIMEOUT_S = 2.0
"""How long ``/health`` and ``/metrics`` wait for a shard before leaving it out."""

_SHARD_ID = re.compile(r"duplex-s(\d+)-")


def shard_of(session_id: str) -> int | None:
    """The shard a session id names (``duplex-s<shard>-...``); ``None`` for any other id."""
    found = _SHARD_ID.match(session_id)
    return int(found.group(1)) if found else None


class ShardProcesses:
    """Shards 1..K-1 of the server: their processes, sockets and control links.

    An async context manager for the private folder of the shards' sockets; ``run``
    starts and supervises the processes until ``stop``.
    """

    def __init__(self, config: Config, registry: MetricsRegistry) -> None:
        self.config = config
        self.count = config.server.session_shards - 1
        self.folder = ""
        self.paths: tuple[str, ...] = ()
        self.stopping = False
        self.links: dict[int, Link] = {}
        self.log = get_logger(component="shards")
        self._answers: dict[int, tuple[trio.Event, dict[int, Any]]] = {}
        self._requests = 0
        self._restarts = registry.counter(
            "duplex_session_shard_restarts_total", "Session shards restarted after exiting"
        )

    async def __aenter__(self) -> ShardProcesses:
        if self.count:
            self.folder = tempfile.mkdtemp(prefix="duplex-shards-")  # mode 0700: ours only
            self.paths = tuple(
                os.path.join(self.folder, f"shard-{i}.sock") for i in range(1, self.count + 1)
            )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every shard, report once all listen, then supervise them until ``stop``."""
        async with trio.open_nursery() as nursery:
            for index in range(1, self.count + 1):
                await nursery.start(self._keep, index)
            task_status.started()

    def stop(self) -> None:
        """Ask every shard to close its sockets and exit once its workers are gone."""
        self.stopping = True
        for link in self.links.values():
            link.post(Stop())

    async def query(self, what: str) -> list[Any]:
        """Each shard's answer to ``what``, in shard order; ``None`` where none came in time."""
        request, self._requests = self._requests, self._requests + 1
        done, answers = trio.Event(), {}
        self._answers[request] = done, answers
        asked = list(self.links.items())
        for _, link in asked:
            link.post(ShardQuery(request, what))
        try:
            with trio.move_on_after(QUERY_TIMEOUT_S):
                while len(answers) < len(asked):
                    await done.wait()
                    done = trio.Event()
                    self._answers[request] = done, answers
        finally:
            del self._answers[request]
        return [answers.get(index) for index in range(1, self.count + 1)]

    async def _keep(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        started = False

        def on_ready() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        while True:
            process, link = await self._spawn(index)
            self.links[index] = link
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(link.send_loop)
                    await self._control(index, link, on_ready)
                    nursery.cancel_scope.cancel()
            finally:
                del self.links[index]
                code = await self._reap(process)
            if self.stopping:
                return
            if code == EXIT_STALE_CODE:
                raise RuntimeError(
                    f"session shard {index}: duplex's code on disk changed since this server "
                    "started; restart the server"
                )
            if not started:
                raise RuntimeError(f"session shard {index} exited with {code} before serving")
            self.log.error("session shard exited; restarting", shard=index, code=code)
            self._restarts.inc()
            await trio.sleep(RESTART_DELAY_S)
            if self.stopping:
                return

    async def _spawn(self, index: int) -> tuple[trio.Process, Link]:
        ours, theirs = socket.socketpair()
        config = base64.b64encode(pickle.dumps(self.config)).decode()
        command = [
            sys.executable,
            "-m",
            "duplex.transport._shard",
            f"--index={index}",
            f"--path={self.paths[index - 1]}",
            f"--control-fd={theirs.fileno()}",
            f"--fingerprint={CODE_FINGERPRINT}",
            f"--config={config}",
        ]
        try:
            process = await trio.lowlevel.open_process(command, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()  # the shard holds it now; ours sees EOF when the shard exits
        return process, Link(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))

    async def _control(self, index: int, link: Link, on_ready: Any) -> None:
        try:
            async for message in link.messages():
                match message:
                    case Ready():
                        on_ready()
                    case ShardAnswer(request, value):
                        if (waiting := self._answers.get(request)) is not None:
                            done, answers = waiting
                            answers[index] = value
                            done.set()
        except LinkBroken as exc:
            self.log.error("session shard link broken", shard=index, error=str(exc))
            await link.stream.aclose()

    async def _reap(self, process: trio.Process) -> int:
        # a stopping shard waits for its workers' graceful shutdown, then exits
        with trio.CancelScope(shield=True):
            with trio.move_on_after(2 * self.config.server.shutdown_grace_s + 5):
                return await process.wait()
            process.kill()
            return await process.wait()
