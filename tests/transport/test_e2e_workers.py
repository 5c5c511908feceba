"""Connection workers end to end: real worker processes, killed, stopped, shared, flooded.

With ``server.connection_workers = N`` the sockets live in N worker processes
(``python -m duplex.topology._frontend``) and the sessions in this one. These
tests find the workers among this process's children and signal them directly.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from duplex.actors import open_actor_system
from duplex.actors._supervisor import unwrap
from duplex.config import load_config
from duplex.metrics import MetricsRegistry
from duplex.topology import _link, serve_duplex
from duplex.topology._link import WINDOW
from duplex.topology._server import SERVER_DEAD_LETTERS
from duplex.topology._workers import LinkedSocket

from ..helpers import free_port, scrape
from ..wire.test_realtime import check_wire
from .test_e2e_duplex import open_session, resume, use_session
from .wsclient import FRAME, Client, Server, append, running_server, silence, tone

BASE = {"session.overlap_policy": "model", "server.realtime_vad": "energy"}
"""The loopback echoes speech once it ends; no silero to load (these tests speak in tones)."""
FRONTEND = b"duplex.topology._frontend"
OPEN_TIMEOUT_S = 30.0
"""A handshake may wait for a restarted worker: its 1 s restart delay, then its startup."""


# -- the worker processes ------------------------------------------------------


def _stat(pid: int) -> tuple[str, int]:
    """A process's state letter and parent pid."""
    with open(f"/proc/{pid}/stat") as f:
        after_name = f.read().rsplit(")", 1)[1].split()
    return after_name[0], int(after_name[1])


def child_pids(module: bytes) -> list[int]:
    """The live children of this process running ``python -m module`` (a killed one, a
    zombie, has no cmdline)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            _, parent = _stat(int(entry))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == os.getpid() and module in argv:
            pids.append(int(entry))
    return sorted(pids)


def worker_pids() -> list[int]:
    """The live connection workers of this process."""
    return child_pids(FRONTEND)


async def stop_process(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped: it accepts no connection meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    with trio.fail_after(5):
        while _stat(pid)[0] not in "Tt":
            await trio.sleep(0.01)


def serving(server: Server) -> int:
    """``duplex_connection_workers_serving``, read in this (the session) process."""
    found = re.search(r"^duplex_connection_workers_serving (\d+)", server.registry.render(), re.M)
    return int(float(found.group(1))) if found else 0


def restarts(server: Server) -> int:
    """``duplex_connection_worker_restarts_total``, read in this (the session) process."""
    match = re.search(
        r"^duplex_connection_worker_restarts_total (\d+)$", server.registry.render(), re.M
    )
    return int(match.group(1)) if match else 0


async def metrics_over_http(server: Server) -> str:
    return (await scrape(server.http, timeout_s=OPEN_TIMEOUT_S)).text


# -- clients -------------------------------------------------------------------


@asynccontextmanager
async def client(server: Server, path: str = "/v1/duplex") -> AsyncIterator[Client]:
    url = server.http.replace("http://", "ws://") + path
    async with connect(url, max_queue=None, open_timeout=OPEN_TIMEOUT_S) as ws:
        yield Client(ws)


async def closed(c: Client, timeout: float = 10.0) -> None:
    """Read until the socket closes; fails if it stays open."""
    with trio.fail_after(timeout), pytest.raises(ConnectionClosed):
        while True:
            await c.recv(timeout)


def heard(events: list[dict[str, Any]], kind: str = "response.audio.delta") -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == kind)


async def echo(c: Client, spoken: bytes, *, timeout: float = 20.0) -> None:
    """Say ``spoken``; the loopback's one response is exactly it."""
    start = len(c.events)
    await c.stream(spoken + silence(8), realtime=False)
    done = await c.until("response.done", timeout)
    assert done["response"]["status"] == "completed"
    answer = c.events[start:]
    assert [e["type"] for e in answer].count("response.created") == 1
    assert heard(answer) == spoken


def cursor(c: Client) -> int:
    return max(e.get("server_event_seq") or 0 for e in c.events)


# -- the session process's side of each worker socket ---------------------------


class Watched:
    """The session process's ``LinkedSocket`` s, watched: frames delivered and taken, and
    a gate that stalls each socket's reader (the connection actor) after its first frame."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sockets: list[LinkedSocket] = []
        self.delivered: dict[int, int] = {}
        self.taken: dict[int, int] = {}
        self.gate = trio.Event()
        self.gate.set()
        init, deliver, receive = LinkedSocket.__init__, LinkedSocket.deliver, LinkedSocket.receive

        def watched_init(socket: LinkedSocket, *args: Any, **kwargs: Any) -> None:
            init(socket, *args, **kwargs)
            self.sockets.append(socket)

        def watched_deliver(socket: LinkedSocket, received: Any, *left: Any) -> None:
            if received is not None:
                self.delivered[id(socket)] = self.delivered.get(id(socket), 0) + 1
            deliver(socket, received, *left)

        async def gated_receive(socket: LinkedSocket) -> Any:
            if self.taken.get(id(socket), 0) >= 1:
                await self.gate.wait()
            received = await receive(socket)
            self.taken[id(socket)] = self.taken.get(id(socket), 0) + 1
            return received

        monkeypatch.setattr(LinkedSocket, "__init__", watched_init)
        monkeypatch.setattr(LinkedSocket, "deliver", watched_deliver)
        monkeypatch.setattr(LinkedSocket, "receive", gated_receive)

    def waiting(self, socket: LinkedSocket) -> int:
        """Frames the worker sent that the connection actor has not taken."""
        return self.delivered.get(id(socket), 0) - self.taken.get(id(socket), 0)


# -- tests ---------------------------------------------------------------------


async def test_health_says_starting_until_every_worker_serves() -> None:
    """Workers start one after another, and the first answers ``/health`` while the others
    still start: until every one serves it says ``starting`` (503, how many serve), so the
    clients that wait for it spread over all workers instead of all landing on the first
    (a socket stays with the worker that accepted it)."""
    port = free_port()
    registry = MetricsRegistry()
    overrides = {**BASE, "server.port": port, "server.connection_workers": 3}
    overrides |= {"server.agent": False, "server.shutdown_grace_s": 0.5}
    answers: list[tuple[int, str | None]] = []
    async with (
        open_actor_system(registry=registry, dead_letter_capacity=SERVER_DEAD_LETTERS) as system,
        trio.open_nursery() as nursery,
        httpx.AsyncClient(timeout=10) as http,
    ):
        config = load_config(env={}, overrides=overrides)
        nursery.start_soon(partial(serve_duplex, config, system, registry=registry))
        with trio.fail_after(60):
            while not answers or answers[-1][0] != 200:
                try:
                    reply = await http.get(f"http://127.0.0.1:{port}/health")
                except httpx.TransportError:  # no worker accepts yet
                    await trio.sleep(0.02)
                    continue
                waiting = reply.json().get("waiting_for", {})
                answers.append((reply.status_code, waiting.get("connection_workers")))
                await trio.sleep(0.02)
        serving_at_ok = re.search(r"^duplex_connection_workers_serving 3$", registry.render(), re.M)
        system.request_shutdown()
    assert answers[-1] == (200, None) and serving_at_ok, answers  # ok once all three serve
    starting = {workers for status, workers in answers if status == 503}
    assert starting and starting <= {"1 of 3 serving", "2 of 3 serving"}, answers


async def test_a_killed_worker_costs_its_sockets_only_and_is_restarted() -> None:
    async with running_server(**BASE, **{"server.connection_workers": 1}) as server:
        (pid,) = worker_pids()
        assert serving(server) == 1
        async with client(server) as c:
            created = await open_session(c)
            await echo(c, tone(4))
            last = cursor(c)
            os.kill(pid, signal.SIGKILL)
            await closed(c)  # the client's socket went with its worker
        session_id = created["session"]["id"]
        with trio.fail_after(10):  # the session process saw the link end and restarts it
            while restarts(server) < 1:
                await trio.sleep(0.02)
        assert serving(server) == 0  # its replacement starts RESTART_DELAY_S (1 s) later
        assert server.system.lookup(session_id) is not None  # waiting out its grace
        # the handshake waits in the listen backlog until the new worker accepts it
        async with client(server) as c2:
            await c2.send(resume(created, last))
            resumed = await c2.recv(OPEN_TIMEOUT_S)
            assert resumed["type"] == "session.resumed"
            assert resumed["session_id"] == session_id
            (new_pid,) = worker_pids()
            assert new_pid != pid  # served by the restarted worker
            await echo(c2, tone(5, amplitude=0.2, start=4))  # and the session works on
            seqs = [e["server_event_seq"] for e in c2.events[1:] if e["server_event_seq"]]
            assert seqs == list(range(last + 1, last + 1 + len(seqs)))  # nothing lost
            text = await metrics_over_http(server)
        assert re.search(r"^duplex_connection_worker_restarts_total 1$", text, re.M)
        assert re.search(r"^duplex_connection_worker_sockets 1$", text, re.M)  # c2 only
        assert re.search(r"^duplex_connection_workers_serving 1$", text, re.M)


async def test_killing_one_of_two_workers_leaves_the_other_workers_sockets_alone() -> None:
    async with running_server(**BASE, **{"server.connection_workers": 2}) as server:
        first, second = worker_pids()
        # place one client on each worker: a stopped worker accepts nothing
        await stop_process(second)
        async with client(server) as doomed:
            created = await open_session(doomed)
            await use_session(doomed)
            os.kill(second, signal.SIGCONT)
            await stop_process(first)
            async with client(server) as survivor:
                await open_session(survivor)
                os.kill(first, signal.SIGKILL)  # stopped or not, SIGKILL ends it
                await closed(doomed)
                # the other worker's socket carries on: a whole response, exact
                await echo(survivor, tone(6, amplitude=0.25))
                assert "error" not in [e["type"] for e in survivor.events]
                assert server.system.lookup(created["session"]["id"]) is not None
                with trio.fail_after(10):
                    while restarts(server) < 1:
                        await trio.sleep(0.02)
                async with client(server) as back:  # whichever worker takes it
                    await back.send(resume(created, cursor(doomed)))
                    assert (await back.recv(OPEN_TIMEOUT_S))["type"] == "session.resumed"
                    await echo(back, tone(3, amplitude=0.15))
                await echo(survivor, tone(3, amplitude=0.35))
        assert restarts(server) == 1
        assert second in worker_pids() and first not in worker_pids()


async def test_concurrent_sessions_on_two_workers_each_hear_only_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sessions = 8
    watched = Watched(monkeypatch)
    async with (
        running_server(**BASE, **{"server.connection_workers": 2}) as server,
        AsyncExitStack() as stack,
    ):
        first, second = worker_pids()
        clients: list[Client] = []
        await stop_process(second)  # half on each worker: a stopped one accepts nothing
        for n in range(sessions):
            if n == sessions // 2:
                os.kill(second, signal.SIGCONT)
                await stop_process(first)
            clients.append(c := await stack.enter_async_context(client(server)))
            await open_session(c)
        os.kill(first, signal.SIGCONT)
        assert len({id(linked.link) for linked in watched.sockets}) == 2  # both links carry
        # a distinct amplitude and phase per session: cross-talk would change the bytes
        said = [tone(8, amplitude=0.05 + 0.05 * n, start=3 * n) for n in range(sessions)]
        assert len(set(said)) == sessions
        async with trio.open_nursery() as nursery:
            for c, spoken in zip(clients, said, strict=True):
                nursery.start_soon(partial(echo, c, spoken, timeout=40))
        assert [heard(c.events) for c in clients] == said


async def test_openai_realtime_route_through_a_worker() -> None:
    workers = {"server.connection_workers": 1}
    path = "/v1/realtime?model=loopback"
    async with running_server(**BASE, **workers) as server, client(server, path) as c:
        created = await c.recv()
        assert created["type"] == "session.created"  # on connect, with no event sent
        detection = created["session"]["audio"]["input"]["turn_detection"]
        assert detection["type"] == "server_vad"
        update = {"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duration_ms": 700}}}}  # fmt: skip
        await c.send({"type": "session.update", "event_id": "u1", "session": update})
        updated = await c.until("session.updated")
        detection = updated["session"]["audio"]["input"]["turn_detection"]
        assert detection["silence_duration_ms"] == 700
        # a turn: the server VAD commits it, the responder answers with it
        spoken = tone(6)
        pcm = spoken + silence(12)  # 960 ms of silence: past the 700 ms
        for i in range(0, len(pcm), 2 * FRAME):
            audio = base64.b64encode(pcm[i : i + 2 * FRAME]).decode()
            await c.send({"type": "input_audio_buffer.append", "audio": audio})
        done = await c.until("response.done", timeout=20)
        assert done["response"]["status"] == "completed"
        for event in c.events:
            check_wire(event, schema="ga", duplex=False)
        kinds = [e["type"] for e in c.events]
        assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
        assert heard(c.events, "response.output_audio.delta") == spoken


async def test_a_flooding_client_of_a_stalled_session_is_held_to_the_window_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session takes nothing for a while; the client sends many more frames than the
    link's window without reading: the worker reads one window ahead and waits (its TCP
    socket holds the rest), and once the session takes them, every sample is echoed."""
    watched = Watched(monkeypatch)
    watched.gate = trio.Event()  # closed: each reader stalls after its first frame
    frames, samples = 96, FRAME // 8  # 10 ms each: 12 whole model frames
    workers = {"server.connection_workers": 1}
    async with running_server(**BASE, **workers) as server, client(server) as c:
        await open_session(c)  # the first frame: session.create
        (linked,) = watched.sockets
        spoken = tone(frames // 8)
        for i in range(frames):
            await c.ws.send(append(spoken[i * samples * 2 : (i + 1) * samples * 2]))
        for _ in range(8):
            await c.ws.send(append(silence(1)))
        # the worker had WINDOW credits; session.create took one and was taken, and
        # credits come back only by half windows: it reads WINDOW - 1 more, then waits
        # (that a worker reads no further than its credits is checked where every task's
        # state is known: ``test_shards.py``, on a mock clock)
        with trio.fail_after(10):
            while watched.waiting(linked) < WINDOW - 1:
                await trio.sleep(0.01)
        assert watched.waiting(linked) == WINDOW - 1
        assert c.events[1:] == []  # nothing came back meanwhile: nothing was taken
        watched.gate.set()
        # only now read: everything, in order
        done = await c.until("response.done", timeout=30)
        assert done["response"]["status"] == "completed"
        assert [e["type"] for e in c.events].count("response.created") == 1
        assert "error" not in [e["type"] for e in c.events]
        assert heard(c.events) == spoken
        assert watched.delivered[id(linked)] == 1 + frames + 8  # every frame crossed


async def test_a_stopped_worker_holds_its_sockets_output_to_the_window_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker writes nothing for a while (SIGSTOP): the session process sends at most a
    window of frames it has not written, then its connection actor waits; the session goes
    on, and once the worker runs again the client gets every event, in order."""
    watched = Watched(monkeypatch)
    async with running_server(**BASE, **{"server.connection_workers": 1}) as server:
        (pid,) = worker_pids()
        async with client(server) as c:
            await open_session(c)
            (linked,) = watched.sockets
            spoken = tone(72)  # about 90 events over 5.8 s: more than a window
            await c.stream(spoken + silence(8), realtime=False)
            with trio.fail_after(10):  # all the input crossed before the stop: no underrun
                while watched.delivered.get(id(linked), 0) < 1 + 72 + 8:
                    await trio.sleep(0.01)
            await c.until("response.audio.delta")
            await stop_process(pid)
            try:
                with trio.fail_after(20):
                    while linked.window.free > 0:
                        await trio.sleep(0.02)
                # waiting, not dropping: the socket stays open, and every event arrives below
                assert linked.window.free == 0 and linked.open
            finally:
                os.kill(pid, signal.SIGCONT)
            done = await c.until("response.done", timeout=30)
            assert done["response"]["status"] == "completed"
            assert heard(c.events) == spoken
            seqs = [e["server_event_seq"] for e in c.events if e["server_event_seq"] is not None]
            assert seqs == list(range(1, len(seqs) + 1))


async def test_a_broken_link_restarts_its_worker_and_the_server_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A link that stops decoding (say a worker started from newer code than the session
    process runs) costs that worker, not the server: it is replaced like a dead one."""

    class Poisoned(_link.Decoder):
        """The session process's decoder, failing on one marked frame as on bad bytes."""

        def feed(self, data: bytes) -> list[Any]:
            messages = super().feed(data)
            for message in messages:
                if isinstance(message, _link.FromSocket) and (
                    getattr(message.received, "event_id", None) == "poison"
                ):
                    raise _link.LinkBroken("an undecodable message (injected)")
            return messages

    monkeypatch.setattr(_link, "Decoder", Poisoned)  # this process only: not the worker
    async with running_server(**BASE, **{"server.connection_workers": 1}) as server:
        async with client(server) as c:
            created = await open_session(c)
            await use_session(c)
            last = cursor(c)
            await c.send(append(silence(1), event_id="poison"))
            await closed(c, timeout=20)  # its worker is reaped with its sockets
        with trio.fail_after(20):
            while restarts(server) < 1:
                await trio.sleep(0.02)
        async with client(server) as c2:  # served by the replacement
            await c2.send(resume(created, last))
            assert (await c2.recv(OPEN_TIMEOUT_S))["type"] == "session.resumed"
            await echo(c2, tone(3))


async def test_a_worker_from_changed_code_refuses_to_start_and_the_server_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Code on disk changed under a running server (a deploy): a worker spawned from it
    could not read the server's pickles, so it exits, and the server stops with one
    clear line instead of serving through a link that breaks on the first frame."""
    monkeypatch.setattr(_link, "CODE_FINGERPRINT", "0" * 16)  # the server's view only
    with pytest.raises(BaseException) as raised:  # a group, or the error itself
        async with running_server(**{"server.connection_workers": 1}):
            pass
    error = unwrap(raised.value)  # one error, not a group of them
    assert isinstance(error, RuntimeError) and "code on disk changed" in str(error), error


async def test_a_worker_that_exits_before_serving_stops_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that cannot start at all (here: its interpreter exits at once) is not
    restarted in a loop: the server stops, naming the worker and its exit code."""
    monkeypatch.setattr(sys, "executable", "/bin/false")  # what _spawn runs the worker with
    with pytest.raises(BaseException) as raised:  # a group, or the error itself
        async with running_server(**{"server.connection_workers": 1}):
            pass
    error = unwrap(raised.value)
    assert isinstance(error, RuntimeError), error
    assert str(error) == "connection worker 0 exited with 1 before serving"
