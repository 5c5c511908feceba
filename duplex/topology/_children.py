"""The server's child processes, kept running: spawned with a link, served, reaped, restarted.

Connection workers (``_workers.py``) and session shards (``_shards.py``) are both
children of the server process that talk to it over a link; ``Children`` is the
supervision they share, and each kind says how to spawn one and serve its link
(``Child``). A child that exits is restarted after ``RESTART_DELAY_S``; one that
exits before it ever served, or refuses to start from changed code, stops the
server with one line saying which and why.
"""

from __future__ import annotations

import argparse
import base64
import pickle
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from duplex.config import Config
from duplex.logs import configure_logging, get_logger
from duplex.metrics import Counter, Gauge

from ._link import CODE_FINGERPRINT, EXIT_STALE_CODE, Link, ShardQuery, Stop

RESTART_DELAY_S = 1.0
"""Pause before a dead child's replacement starts, so a crash loop cannot spin a core."""

QUERY_TIMEOUT_S = 2.0
"""How long ``/health`` and ``/metrics`` wait for a child before leaving it out."""


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


def child_args(config: Config, index: int, path: str) -> list[str]:
    """The arguments every linked child takes: its index, its socket, this process's code
    fingerprint and the config (a pickle: both ends are this install)."""
    return [
        f"--index={index}",
        f"--path={path}",
        f"--fingerprint={CODE_FINGERPRINT}",
        f"--config={base64.b64encode(pickle.dumps(config)).decode()}",
    ]


def child_parser(description: str) -> argparse.ArgumentParser:
    """The parser of a linked child's command line (`child_args` and ``--link-fd``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--fingerprint", required=True)
    parser.add_argument("--config", required=True)
    return parser


def child_config(args: argparse.Namespace, **log_context: Any) -> Config | None:
    """A child's start: signals left to the server, its code checked against the server's,
    its config read and its logging set up. ``None``: the code on disk changed since the
    server started (logged; the child exits with ``EXIT_STALE_CODE``)."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # to a process group: the server stops us
        signal.signal(signum, signal.SIG_IGN)
    if args.fingerprint != CODE_FINGERPRINT:
        configure_logging("console", "error")
        get_logger(**log_context).error(
            "duplex's code on disk changed since the server started; not starting"
        )
        return None
    config: Config = pickle.loads(base64.b64decode(args.config))
    configure_logging(config.server.log_format, config.server.log_level)
    return config


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
        self.processes: dict[int, trio.Process] = {}
        """Each child's current process (while it runs)."""
        self.ready: set[int] = set()
        """Children that said ``Ready`` on their current link."""
        self.started = False
        """Every child has served once (set as the last says ``Ready``, and by ``run`` once it
        started them all): until then the server says ``starting``, so the first clients are
        not all taken by the first child."""
        self.stopping = False
        self.paused = False
        """Children asked to stop for a while (`pause`): not restarted until `resume`."""
        self._resumed = trio.Event()
        self.log = get_logger(component="children")
        self._restarts = restarts
        self._serving = serving

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every child, report once all serve, then keep them until ``stop``."""
        async with trio.open_nursery() as nursery:
            for index in self.indices:
                await nursery.start(self._keep, index)
            self.started = True
            task_status.started()

    def stop(self) -> None:
        """Ask every child to finish and exit (one being started is asked once it is)."""
        self.stopping = True
        self._resumed.set()  # a paused child's keeper returns
        for link in self.links.values():
            link.post(Stop())

    async def pause(self) -> None:
        """Ask every child to finish and exit, and return once none runs; they stay
        stopped (no restart, nothing logged as a crash) until `resume`."""
        self.paused = True
        self._resumed = trio.Event()
        for link in self.links.values():
            link.post(Stop())
        while self.processes:
            await trio.sleep(0.05)

    async def resume(self) -> None:
        """Start the paused children again; returns once every one says ``Ready``."""
        self.paused = False
        self._resumed.set()
        while self.ready != set(self.indices) and not self.stopping:
            await trio.sleep(0.05)

    def kill(self, index: int) -> bool:
        """SIGKILL child ``index`` now (one that is alive but stuck): it is reaped and
        restarted as if it had crashed. Whether there was a running process to kill."""
        process = self.processes.get(index)
        if process is None or process.returncode is not None:
            return False
        process.kill()
        return True

    async def _keep(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        kind = self.child.kind
        started = False

        def on_ready() -> None:
            nonlocal started
            if index not in self.ready:
                self.ready.add(index)
                if self._serving is not None:
                    self._serving.inc()
                if self.ready == set(self.indices):  # now, not a scheduling step later in run
                    self.started = True
            if not started:
                started = True
                task_status.started()

        while True:
            process, link = await self.child.spawn(index)
            self.links[index] = link
            self.processes[index] = process
            if self.stopping or self.paused:  # asked while this one was being spawned
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
                self.processes.pop(index, None)
            if self.stopping:
                return
            if self.paused and started:
                self.log.info(f"{kind} paused", index=index, code=code)
                await self._resumed.wait()
                if self.stopping:
                    return
                continue
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


@dataclass
class _Query:
    expected: set[int]
    answers: dict[int, Any] = field(default_factory=dict)
    done: trio.Event = field(default_factory=trio.Event)


class ChildQueries:
    """Questions to every serving child of one `Children` (``ShardQuery``) and their answers
    (``ShardAnswer``, handed to `answered` by whoever reads the child's link)."""

    def __init__(self, children: Children, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.children = children
        self.timeout_s = timeout_s
        self._queries: dict[int, _Query] = {}
        self._requests = 0

    async def ask(self, what: str) -> dict[int, Any]:
        """Each serving child's answer to ``what``, by index; a child that is not serving
        (starting, restarting) or does not answer within ``timeout_s`` is left out."""
        request, self._requests = self._requests, self._requests + 1
        ready = {i: self.children.links[i] for i in self.children.ready}
        query = self._queries[request] = _Query(set(ready))
        for link in ready.values():
            link.post(ShardQuery(request, what))
        try:
            if ready:
                with trio.move_on_after(self.timeout_s):
                    await query.done.wait()
        finally:
            del self._queries[request]
        return dict(query.answers)

    def answered(self, index: int, request: int, value: Any) -> None:
        """Child ``index``'s answer to ``request`` (late or unasked answers are dropped)."""
        query = self._queries.get(request)
        if query is not None and index in query.expected:
            query.answers[index] = value
            if len(query.answers) == len(query.expected):
                query.done.set()
