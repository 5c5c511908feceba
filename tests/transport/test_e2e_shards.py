"""Session shards end to end: real shard and worker processes, spread, resumed, full, killed.

With ``server.session_shards = 2`` this process is shard 0 and runs shard 1
(``python -m duplex.topology._shard``); the connection workers connect to both and
place each session. These tests find the shard among this process's children and
signal it directly, and stop workers (SIGSTOP) to choose which one accepts a socket.
"""

from __future__ import annotations

import base64
import os
import re
import signal
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from websockets.exceptions import ConnectionClosed

from duplex.sessions import shard_of

from .test_e2e_duplex import open_session, resume
from .test_e2e_workers import (
    BASE,
    OPEN_TIMEOUT_S,
    child_pids,
    client,
    cursor,
    echo,
    heard,
    metrics_over_http,
    stop_process,
    worker_pids,
)
from .wsclient import FRAME, Client, Server, running_server, silence, tone

SHARDED = {**BASE, "server.connection_workers": 2, "server.session_shards": 2}
SHARD = b"duplex.topology._shard"


# -- the shard processes -------------------------------------------------------


def shard_pids() -> list[int]:
    """The live session shards of this process."""
    return child_pids(SHARD)


def shard_restarts(server: Server) -> int:
    """``duplex_session_shard_restarts_total``, read in this (the server) process."""
    found = re.search(
        r"^duplex_session_shard_restarts_total (\d+)$", server.registry.render(), re.M
    )
    return int(found.group(1)) if found else 0


async def health_over_http(server: Server) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        reply = await http.get(server.http + "/health", timeout=OPEN_TIMEOUT_S)
    return reply.status_code, reply.json()


@contextmanager
def continued_at_exit(*pids: int) -> Iterator[None]:
    """SIGCONT every one of ``pids`` on the way out: a stopped worker never shuts down."""
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


# -- clients -------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def shard_of_created(created: dict[str, Any]) -> int | None:
    return shard_of(created["session"]["id"])


async def open_on_shard(
    stack: AsyncExitStack, server: Server, shard: int, *, tries: int = 4
) -> tuple[Client, dict[str, Any]]:
    """Open sessions (kept open in ``stack``) until one lands on ``shard``."""
    for _ in range(tries):
        c = await stack.enter_async_context(client(server))
        created = await open_session(c)
        if shard_of_created(created) == shard:
            return c, created
    raise AssertionError(f"no session landed on shard {shard} in {tries} tries")


async def close_code(c: Client, timeout: float = 10.0) -> int | None:
    """Read until the socket closes; the close code the server sent (fails if it stays open)."""
    with trio.fail_after(timeout), pytest.raises(ConnectionClosed) as closed:
        while True:
            await c.recv(timeout)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


async def refused(c: Client) -> dict[str, Any]:
    """``session.create`` on ``c``; the error it gets (after which the socket closes 1013)."""
    await c.send({"type": "session.create", "event_id": "x", "session": {}})
    answer = await c.recv(OPEN_TIMEOUT_S)
    assert answer["type"] == "error", answer
    assert await close_code(c) == 1013
    return answer


# -- tests ---------------------------------------------------------------------


async def test_sessions_spread_over_shards_hear_only_themselves_and_http_sums_them() -> None:
    sessions = 4
    async with running_server(**SHARDED) as server, AsyncExitStack() as stack:
        assert len(shard_pids()) == 1 and len(worker_pids()) == 2
        clients: list[Client] = []
        ids = []
        for _ in range(sessions):
            clients.append(c := await stack.enter_async_context(client(server)))
            ids.append((await open_session(c))["session"]["id"])
        assert all(re.fullmatch(r"duplex-s[01]-[0-9a-f]{32}", i) for i in ids), ids
        # each new session goes to the shard with the most room: two each
        assert sorted(shard_of(i) for i in ids) == [0, 0, 1, 1], ids
        # a distinct amplitude and phase per session: cross-talk would change the bytes
        said = [tone(6, amplitude=0.05 + 0.07 * n, start=3 * n) for n in range(sessions)]
        async with trio.open_nursery() as nursery:
            for c, spoken in zip(clients, said, strict=True):
                nursery.start_soon(partial(echo, c, spoken, timeout=40))
        assert [heard(c.events) for c in clients] == said

        status, health = await health_over_http(server)
        assert status == 200 and health["status"] == "ok"
        assert [s["shard"] for s in health["shards"]] == [0, 1]
        assert [s["status"] for s in health["shards"]] == ["ok", "ok"]
        assert [s["sessions"]["live"] for s in health["shards"]] == [2, 2]
        assert health["sessions"]["live"] == sessions
        capacities = [s["sessions"]["capacity"] for s in health["shards"]]
        assert health["sessions"]["capacity"] == sum(capacities) > 0  # an engine per shard

        text = await metrics_over_http(server)
        live = dict(re.findall(r'^duplex_sessions_live\{shard="(\d+)"\} (\d+)$', text, re.M))
        assert live == {"0": "2", "1": "2"}
        assert text.count("# TYPE duplex_sessions_live gauge") == 1  # one family, two shards
        assert not re.search(r"^duplex_sessions_live ", text, re.M)  # every sample labelled


async def test_a_resume_through_another_worker_lands_on_the_owning_shard() -> None:
    async with running_server(**SHARDED) as server:
        first, second = worker_pids()
        with continued_at_exit(first, second):
            await stop_process(second)  # the session's socket goes to the first worker
            async with AsyncExitStack() as stack:
                c, created = await open_on_shard(stack, server, 1)
                await c.stream(tone(12), realtime=False)
                await c.until("response.audio.delta", timeout=20)
                last = cursor(c)
            # dropped mid-response; the resume can only reach the other worker
            os.kill(second, signal.SIGCONT)
            await stop_process(first)
            async with client(server) as c2:
                await c2.send(resume(created, last))
                resumed = await c2.recv(OPEN_TIMEOUT_S)
                assert resumed["type"] == "session.resumed", resumed
                assert resumed["session_id"] == created["session"]["id"]
                await c2.stream(silence(6), realtime=False)
                done = await c2.until("response.done", timeout=20)
                assert done["response"]["status"] == "completed"
                replayed = [e["server_event_seq"] for e in c2.events[1:] if e["server_event_seq"]]
                assert replayed == list(range(last + 1, last + 1 + len(replayed)))  # no gap
                audio = heard(c.events) + heard(c2.events)
                assert audio == tone(12)  # nothing lost across the two sockets
                await echo(c2, tone(3, amplitude=0.2))  # and the session works on


async def test_max_sessions_is_split_over_shards_and_freed_room_is_used() -> None:
    limits = {"server.max_sessions": 4}
    async with running_server(**SHARDED, **limits) as server, AsyncExitStack() as stack:
        status, health = await health_over_http(server)
        assert status == 200
        assert [s["sessions"]["capacity"] for s in health["shards"]] == [2, 2]
        assert health["sessions"]["capacity"] == 4
        opened: list[tuple[Client, dict[str, Any]]] = []
        for _ in range(4):  # every one admitted: none is sent to a full shard
            c = await stack.enter_async_context(client(server))
            opened.append((c, await open_session(c)))
        assert sorted(shard_of_created(created) for _, created in opened) == [0, 0, 1, 1]
        async with client(server) as fifth:
            error = (await refused(fifth))["error"]
            assert (error["code"], error["type"]) == ("resource_exhausted", "rate_limit_error")
        # one session of shard 1 closes: only shard 1 has room, and a new session finds it
        leaving = next(c for c, created in opened if shard_of_created(created) == 1)
        await leaving.send({"type": "session.close"})
        await leaving.until("session.closed")
        with trio.fail_after(5):
            while True:
                async with client(server) as c:
                    await c.send({"type": "session.create", "event_id": "y", "session": {}})
                    answer = await c.recv(OPEN_TIMEOUT_S)
                    if answer["type"] == "session.created":
                        assert shard_of_created(answer) == 1
                        break
                    assert answer["error"]["code"] == "resource_exhausted"  # Load not seen yet
                await trio.sleep(0.1)
        status, health = await health_over_http(server)
        assert status == 200  # full is healthy
        # the new session's socket left before its client said anything: it ended with it
        with trio.fail_after(5):
            while [s["sessions"]["live"] for s in health["shards"]] != [2, 1]:
                await trio.sleep(0.05)
                status, health = await health_over_http(server)


async def test_a_killed_shard_costs_its_sockets_only_and_is_restarted() -> None:
    async with running_server(**SHARDED) as server, AsyncExitStack() as stack:
        (pid,) = shard_pids()
        survivor, _ = await open_on_shard(stack, server, 0)
        doomed, lost = await open_on_shard(stack, server, 1)
        await echo(doomed, tone(3))
        os.kill(pid, signal.SIGKILL)
        assert await close_code(doomed) == 1011  # its worker closed it: the shard is gone
        status, health = await health_over_http(server)  # shard 0 still takes sessions
        assert (status, health["status"]) == (200, "degraded"), health
        assert [s["status"] for s in health["shards"]] == ["ok", "unavailable"]
        await echo(survivor, tone(4, amplitude=0.2))  # shard 0's session is untouched
        with trio.fail_after(10):
            while shard_restarts(server) < 1:
                await trio.sleep(0.02)
        # new sessions find shard 1 again after its 1 s restart delay, its startup and the
        # workers reconnecting (each socket stays open in ``stack``: no cancel scope around)
        deadline = trio.current_time() + 20
        while True:
            c = await stack.enter_async_context(client(server))
            if shard_of_created(await open_session(c)) == 1:
                break
            await c.send({"type": "session.close"})
            await c.until("session.closed")
            assert trio.current_time() < deadline, "no new session landed on shard 1"
            await trio.sleep(0.2)
        (new_pid,) = shard_pids()
        assert new_pid != pid
        await echo(c, tone(3, amplitude=0.25))  # the new shard serves
        # the killed shard's session is gone with it
        async with client(server) as back:
            await back.send(resume(lost, cursor(doomed)))
            error = await back.recv(OPEN_TIMEOUT_S)
            assert error["type"] == "error"
            assert error["error"]["code"] == "session_resume_expired"
            assert await close_code(back) == 1008
        await echo(survivor, tone(3, amplitude=0.35))
        assert shard_restarts(server) == 1
        text = await metrics_over_http(server)
        assert re.search(r'^duplex_session_shard_restarts_total\{shard="0"\} 1$', text, re.M)
        status, health = await health_over_http(server)
        assert status == 200 and [s["status"] for s in health["shards"]] == ["ok", "ok"]


async def test_a_socket_held_for_its_first_event_is_closed_1001_at_shutdown() -> None:
    """No shard has it yet, so its worker closes it; shutdown does not wait out the grace."""
    grace = 5.0
    settings = {"server.shutdown_grace_s": grace}
    async with running_server(**SHARDED, **settings) as server, client(server) as idle:
        # accepted, and held by its worker for a first event: a guess still, since nothing
        # outside the worker process shows the socket held (docs/testing.md)
        await trio.sleep(0.3)
        began = trio.current_time()
        server.system.request_shutdown()
        assert await close_code(idle, timeout=grace) == 1001
        assert trio.current_time() - began < grace / 2


async def test_the_first_event_timeout_counts_the_time_a_worker_held_the_socket() -> None:
    """A worker holds a ``/v1/duplex`` socket until its first event (to choose a shard);
    the timeout runs from the accept, not again from the shard's turn. How long each side
    waits is checked on a mock clock (``test_shards.py``: the worker hands on what it
    waited, the shard times out the rest); here, that a silent socket is refused and closed
    through the real processes."""
    timeout = 1.0
    settings = {"server.first_event_timeout_s": timeout}
    async with running_server(**SHARDED, **settings) as server:
        async with client(server) as idle:
            err = await idle.recv(timeout=5.0)
            assert (err["type"], err["error"]["code"]) == ("error", "first_event_timeout")
            assert await close_code(idle) == 1008
        async with client(server) as prompt:  # a session opened in time is never timed out
            await trio.sleep(0.6 * timeout)  # the thing under test: silent, within the timeout
            created = await open_session(prompt)
            shard = shard_of_created(created)
            _, health = await health_over_http(server)  # the shard its id names holds it
            live = [s["sessions"]["live"] for s in health["shards"]]
            assert live == [int(i == shard) for i in range(2)], (shard, live)
            await trio.sleep(1.2 * timeout)  # the thing under test: past it, an open session
            await prompt.send({"type": "session.close"})
            await prompt.until("session.closed")


async def test_openai_realtime_sessions_start_on_both_shards() -> None:
    path = "/v1/realtime?model=loopback"
    async with running_server(**SHARDED) as server, AsyncExitStack() as stack:
        clients: list[Client] = []
        ids = []
        for _ in range(2):
            clients.append(c := await stack.enter_async_context(client(server, path)))
            created = await c.recv(OPEN_TIMEOUT_S)
            assert created["type"] == "session.created"  # on connect, with no event sent
            ids.append(created["session"]["id"])
        assert sorted(shard_of(i) for i in ids) == [0, 1], ids  # autostart: the roomiest
        # a turn on each: the server VAD commits it, the responder answers with it
        said = [tone(6, amplitude=0.2), tone(6, amplitude=0.3, start=5)]

        async def turn(c: Client, spoken: bytes) -> None:
            pcm = spoken + silence(12)
            for i in range(0, len(pcm), 2 * FRAME):
                await c.send(
                    {"type": "input_audio_buffer.append", "audio": b64(pcm[i : i + 2 * FRAME])}
                )
            done = await c.until("response.done", timeout=30)
            assert done["response"]["status"] == "completed"

        async with trio.open_nursery() as nursery:
            for c, spoken in zip(clients, said, strict=True):
                nursery.start_soon(turn, c, spoken)
        assert [heard(c.events, "response.output_audio.delta") for c in clients] == said
