"""The server's child processes, kept running: spawned with a link, served, reaped, restarted.

Connection workers (``_workers.py``) and session shards (``_shards.py``) are both
children of the server process that talk to it over a link; ``Children`` is the
supervision they share, and each kind says how to spawn one and serve its link
(``Child``). A child that exits is restarted after ``RESTART_DELAY_S``; one that
exits before it ever served, or refuses to start from changed code, stops the
server with one line saying which and why.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from duplex.logs import get_logger
from duplex.metrics import Counter, Gauge

from ._link import EXIT_STALE_CODE, Link, Stop

RESTART_DELAY_S = 1.0
"""Pause before a dead child's replacement starts, so a crash loop cannot spin a core."""


class Child(Protocol):
    """One kind of child process, as ``Children`` runs it."""

    kind: str
    """What the logs and errors call it: ``connection worker``, ``session shard``."""

    async def spawn(self, index: int) -> tuple[trio.Process, Link]:
        """Start child ``index``, linked to this process (``spawn_linked``)."""
        ...

    async def serve(self, index: int, link: Link, on_ready: Callable[[], None]) -> None:
        """Handle the child's messages until its link ends; ``on_ready`` on each ``Ready``."""
        ...


async def spawn_linked(
    module: str, args: Sequence[str], pass_fds: Sequence[int] = ()
) -> tuple[trio.Process, Link]:
    """``python -m module --link-fd=N *args``, with a link over a fresh socketpair."""
    ours, theirs = socket.socketpair()
    command = [sys.executable, "-m", module, f"--link-fd={theirs.fileno()}", *args]
    try:
        process = await trio.lowlevel.open_process(command, pass_fds=(theirs.fileno(), *pass_fds))
    finally:
        theirs.close()  # the child holds it now; ours sees EOF when the child exits
    return process, Link(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))


class Children:
    """Children ``indices`` of one kind: started by ``run``, kept until ``stop``."""

    def __init__(
        self,
        child: Child,
        indices: Sequence[int],
        *,
        reap_after_s: float,
        restarts: Counter | None = None,
        serving: Gauge | None = None,
    ) -> None:
        """``reap_after_s``: how long a child that is stopping may take before it is killed."""
        self.child = child
        self.indices = indices
        self.reap_after_s = reap_after_s
        self.links: dict[int, Link] = {}
        self.ready: set[int] = set()
        """Children that said ``Ready`` on their current link."""
        self.stopping = False
        self.log = get_logger(component="children")
        self._restarts = restarts
        self._serving = serving

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every child, report once all serve, then keep them until ``stop``."""
        async with trio.open_nursery() as nursery:
            for index in self.indices:
                await nursery.start(self._keep, index)
            task_status.started()

    def stop(self) -> None:
        """Ask every child to finish and exit (one being started is asked once it is)."""
        self.stopping = True
        for link in self.links.values():
            link.post(Stop())

    async def _keep(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        kind = self.child.kind
        started = False

        def on_ready() -> None:
            nonlocal started
            if index not in self.ready:
                self.ready.add(index)
                if self._serving is not None:
                    self._serving.inc()
            if not started:
                started = True
                task_status.started()

        while True:
            process, link = await self.child.spawn(index)
            self.links[index] = link
            if self.stopping:  # ``stop`` came while this one was being spawned
                link.post(Stop())
            try:
                await link.while_sending(self.child.serve, index, link, on_ready)
            finally:
                del self.links[index]
                if index in self.ready:
                    self.ready.discard(index)
                    if self._serving is not None:
                        self._serving.dec()
                with trio.CancelScope(shield=True):
                    await link.stream.aclose()  # EOF: a child whose server is failing exits now
                code = await self._reap(process)
            if self.stopping:
                return
            if code == EXIT_STALE_CODE:
                raise RuntimeError(
                    f"{kind} {index}: duplex's code on disk changed since this server started; "
                    "restart the server"
                )
            if not started:
                raise RuntimeError(f"{kind} {index} exited with {code} before serving")
            self.log.error(f"{kind} exited; restarting", index=index, code=code)
            if self._restarts is not None:
                self._restarts.inc()
            await trio.sleep(RESTART_DELAY_S)
            if self.stopping:
                return

    async def _reap(self, process: trio.Process) -> int:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.reap_after_s):
                return await process.wait()
            process.kill()
            return await process.wait()
