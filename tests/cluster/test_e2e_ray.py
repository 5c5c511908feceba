"""Three duplex nodes on a local Ray cluster (``ray.cluster_utils.Cluster``), through the
ingress: spread, resumed, full, killed, drained, joined.

One cluster for the module (starting Ray and three servers takes tens of seconds);
the tests run in order and each leaves the nodes as the next expects (sessions
closed). Every Ray listener is on 127.0.0.1 (``conftest.py``); nodes serve the
loopback model without the agent, each at most ``PER_NODE`` sessions.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import trio
from ray.cluster_utils import Cluster
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from duplex.cli import main
from duplex.cluster import (
    LOOPBACK_ENV,
    NODE_RESOURCE,
    Ingress,
    NodeRow,
    NodeState,
    RayTable,
    node_of_object,
    serve_ingress,
    start_controller,
)

from ..transport.test_e2e_duplex import open_session, resume
from ..transport.test_e2e_workers import cursor, echo, heard
from ..transport.wsclient import Client, silence, tone

ROOT = Path(__file__).resolve().parent.parent.parent
PER_NODE = 3
NODE_ARGS = dict(num_cpus=1, object_store_memory=80 * 1024**2, node_ip_address="127.0.0.1")
SERVE_ENV = {
    "DUPLEX_AGENT": "false",
    "DUPLEX_REALTIME_VAD": "energy",
    "DUPLEX_TTS": "none",
    "DUPLEX_MAX_SESSIONS": str(PER_NODE),
    "DUPLEX_LOG_LEVEL": "warning",
}


@dataclass
class Ray3:
    cluster: Cluster
    controller: Any
    hosts: list[Any]

    def rows(self) -> list[NodeRow]:
        return list(ray.get(self.controller.rows.remote(), timeout=10))


def wait_until(what: str, check: Any, timeout: float = 60.0) -> Any:
    """Poll ``check()`` (a sync Ray read) until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def ray3() -> Iterator[Ray3]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **NODE_ARGS,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
        },
    )
    hosts = [cluster.add_node(**NODE_ARGS, resources={NODE_RESOURCE: 1}) for _ in range(3)]
    ray.init(address=cluster.address, namespace="duplex", log_to_driver=False)
    handle = start_controller(poll_s=0.25, drain_grace_s=2.0, env=SERVE_ENV)
    ray3 = Ray3(cluster, handle, hosts)
    try:
        wait_until(
            "3 serving nodes",
            lambda: sum(r.report.state is NodeState.SERVING for r in ray3.rows()) == 3,
        )
        yield ray3
    finally:
        try:
            ray.get(handle.shutdown.remote(), timeout=30)
        finally:
            ray.shutdown()
            cluster.shutdown()


@asynccontextmanager
async def ingress_of(ray3: Ray3) -> AsyncIterator[tuple[Ingress, str]]:
    """One ingress copy on a free loopback port; its base URL."""
    ingress = Ingress(RayTable(ray3.controller), refresh_s=0.1)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_ingress, ingress, "127.0.0.1", 0)
        await ingress.refreshed.wait()
        try:
            yield ingress, url
        finally:
            nursery.cancel_scope.cancel()
            await ingress.aclose()


@asynccontextmanager
async def client_of(url: str) -> AsyncIterator[Client]:
    async with connect(url.replace("http", "ws", 1) + "/v1/duplex", max_queue=None) as ws:
        yield Client(ws)


async def close_session(c: Client) -> None:
    """End the session (not just the socket): its slot is free for the next test."""
    await c.send({"type": "session.close", "event_id": "bye"})
    with trio.fail_after(10), pytest.raises(ConnectionClosed):
        while True:
            await c.recv(10)


async def closed_with(c: Client, timeout: float = 10.0) -> tuple[int | None, list[dict[str, Any]]]:
    """Read until the socket closes: its close code and the events read on the way."""
    start = len(c.events)
    with trio.fail_after(timeout), pytest.raises(ConnectionClosed) as closed:
        while True:
            await c.recv(timeout)
    code = closed.value.rcvd.code if closed.value.rcvd is not None else None
    return code, c.events[start:]


async def wait_for(what: str, check: Any, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.05)


def node_id(created: dict[str, Any]) -> str:
    name = node_of_object(created["session"]["id"])
    assert name is not None, created
    return name


# -- tests, in order -----------------------------------------------------------


def test_every_ray_listener_is_on_loopback(ray3: Ray3) -> None:
    assert {k: os.environ[k] for k in LOOPBACK_ENV} == LOOPBACK_ENV
    if shutil.which("ss") is None:
        pytest.skip("no ss here to list listeners")
    listing = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True)
    ours = [line for line in listing.stdout.splitlines() if "ray" in line or "gcs_server" in line]
    assert ours, listing.stdout
    for line in ours:
        local = line.split()[3]
        assert local.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")), line


async def test_sessions_spread_by_room_and_a_resume_finds_its_node(ray3: Ray3) -> None:
    async with AsyncExitStack() as stack:
        _, url = await stack.enter_async_context(ingress_of(ray3))
        clients = []
        for _ in range(6):
            c = await stack.enter_async_context(client_of(url))
            clients.append((c, await open_session(c)))
        spread = Counter(node_id(created) for _, created in clients)
        assert sorted(spread.values()) == [2, 2, 2], spread  # the most room first, each time

        c, created = clients[0]
        await c.stream(tone(12), realtime=False)
        await c.until("response.audio.delta", timeout=20)
        last = cursor(c)
        await c.ws.aclose()  # the socket drops mid-response; the session waits
        # a second ingress copy, which has never seen the session: the id names its node
        _, url2 = await stack.enter_async_context(ingress_of(ray3))
        c2 = await stack.enter_async_context(client_of(url2))
        await c2.send(resume(created, last))
        resumed = await c2.recv(10)
        assert resumed["type"] == "session.resumed", resumed
        await c2.stream(silence(6), realtime=False)
        done = await c2.until("response.done", timeout=20)
        assert done["response"]["status"] == "completed"
        seqs = [e["server_event_seq"] for e in c2.events[1:] if e.get("server_event_seq")]
        assert seqs == list(range(last + 1, last + 1 + len(seqs)))  # no gap, no duplicate
        assert heard(c.events) + heard(c2.events) == tone(12)
        await close_session(c2)
        for other, _ in clients[1:]:
            await close_session(other)


async def test_a_full_cluster_refuses_like_one_server_and_admits_again(ray3: Ray3) -> None:
    async with AsyncExitStack() as stack:
        ingress, url = await stack.enter_async_context(ingress_of(ray3))
        await wait_for("every slot free", lambda: ingress.sessions()["live"] == 0)
        opened = []
        for _ in range(3 * PER_NODE):
            c = await stack.enter_async_context(client_of(url))
            opened.append((c, await open_session(c)))
        async with client_of(url) as extra:
            await extra.send({"type": "session.create", "event_id": "x", "session": {}})
            code, events = await closed_with(extra)
        assert code == 1013
        assert [e["error"]["code"] for e in events] == ["resource_exhausted"]
        async with httpx.AsyncClient() as http:
            text = (await http.get(url + "/metrics")).text
        assert 'duplex_cluster_refused_total{reason="full"} 1' in text
        # one session ends: its node reports the room and a new session gets it
        leaving, created = opened.pop()
        await close_session(leaving)
        await wait_for(
            "the freed slot reported", lambda: ingress.placement.room(node_id(created)) > 0
        )
        c = await stack.enter_async_context(client_of(url))
        assert node_id(await open_session(c)) == node_id(created)
        opened.append((c, created))
        for c, _ in opened:
            await close_session(c)


def row_of(ray3: Ray3, name: str) -> NodeRow:
    (row,) = [r for r in ray3.rows() if r.report.name == name]
    return row


async def test_a_killed_node_tells_its_clients_at_once_and_spares_the_others(ray3: Ray3) -> None:
    async with AsyncExitStack() as stack:
        ingress, url = await stack.enter_async_context(ingress_of(ray3))
        await wait_for("every slot free", lambda: ingress.sessions()["live"] == 0)
        clients = []
        for _ in range(3):  # one per node
            c = await stack.enter_async_context(client_of(url))
            clients.append((c, await open_session(c)))
        victim_client, victim = clients[0]
        row = row_of(ray3, node_id(victim))
        host = next(h for h in ray3.hosts if h.node_id == row.ray_node)
        killed_at = trio.current_time()
        # the whole Ray node, SIGKILLed: its raylet, its workers, and with them the server
        await trio.to_thread.run_sync(lambda: ray3.cluster.remove_node(host, allow_graceful=False))
        code, events = await closed_with(victim_client, timeout=5)
        assert trio.current_time() - killed_at < 2.0
        assert code == 1011
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["node_lost"]
        ray3.hosts.remove(host)
        # Ray says it is gone: its sessions' resumes expire cleanly, on any ingress copy
        await wait_for("the node gone", lambda: ingress.placement.room(node_id(victim)) == 0)
        await trio.to_thread.run_sync(
            lambda: wait_until(
                "gone", lambda: row_of(ray3, node_id(victim)).report.state is NodeState.GONE
            )
        )
        async with client_of(url) as again:
            await again.send(resume(victim, 0))
            code, events = await closed_with(again)
        assert code == 1008
        assert [e["error"]["code"] for e in events] == ["session_resume_expired"]
        # the others never noticed
        for n, (c, _) in enumerate(clients[1:]):
            await echo(c, tone(4, amplitude=0.2 + 0.1 * n))
            await close_session(c)


async def test_a_node_whose_server_is_killed_is_replaced_on_its_host(ray3: Ray3) -> None:
    async with AsyncExitStack() as stack:
        ingress, url = await stack.enter_async_context(ingress_of(ray3))
        await wait_for("every slot free", lambda: ingress.sessions()["live"] == 0)
        c = await stack.enter_async_context(client_of(url))
        victim = node_id(await open_session(c))
        row = row_of(ray3, victim)
        os.killpg(row.pid, signal.SIGKILL)  # the server and its children; its host lives
        code, events = await closed_with(c, timeout=5)
        assert code == 1011
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["node_lost"]

        def replaced() -> list[NodeRow]:
            gone = row_of(ray3, victim).report.state is NodeState.GONE
            fresh = [
                r
                for r in ray3.rows()
                if r.ray_node == row.ray_node
                and r.report.name != victim
                and r.report.state is NodeState.SERVING
            ]
            return fresh if gone else []

        (fresh,) = await trio.to_thread.run_sync(lambda: wait_until("a replacement", replaced))
        assert row_of(ray3, victim).reason.startswith("server exited")
        await wait_for(
            "the replacement seen", lambda: ingress.placement.room(fresh.report.name) > 0
        )
        opened = []
        while True:  # new sessions reach it (the most room once the others are as full)
            other = await stack.enter_async_context(client_of(url))
            opened.append(other)
            if node_id(await open_session(other)) == fresh.report.name:
                break
            assert len(opened) <= 2 * PER_NODE
        await echo(other, tone(3))
        for other in opened:
            await close_session(other)


async def test_a_drained_node_keeps_its_sessions_to_the_end_then_stops(
    ray3: Ray3, capsys: pytest.CaptureFixture[str]
) -> None:
    async with AsyncExitStack() as stack:
        ingress, url = await stack.enter_async_context(ingress_of(ray3))
        await wait_for("every slot free", lambda: ingress.sessions()["live"] == 0)
        c = await stack.enter_async_context(client_of(url))
        created = await open_session(c)
        drained = node_id(created)
        address = ["--address", ray3.cluster.address]
        assert main(["cluster", "drain", drained, *address]) == 0  # what an operator runs
        assert main(["cluster", "drain", "nosuchnode", *address]) == 1
        await wait_for("the drain seen", lambda: ingress.placement.room(drained) == 0)
        assert main(["cluster", "nodes", *address]) == 0
        listed = {
            line.split()[0]: line.split()[1:4] for line in capsys.readouterr().out.splitlines()
        }
        state, _, capacity = listed[drained]  # (live: as of its last report)
        assert (state, capacity) == ("draining", str(PER_NODE))
        # new sessions go elsewhere; the drained node's own session goes on, nothing lost
        others = []
        for _ in range(2):
            other = await stack.enter_async_context(client_of(url))
            assert node_id(await open_session(other)) != drained
            others.append(other)
        await c.stream(tone(10), realtime=False)
        await c.stream(silence(8), realtime=False)
        done = await c.until("response.done", timeout=20)
        assert done["response"]["status"] == "completed"
        seqs = [e["server_event_seq"] for e in c.events if e.get("server_event_seq")]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # 0 lost events
        assert heard(c.events) == tone(10)
        await close_session(c)
        # its last session ended: the node stops, and is not restarted on its host
        state = await trio.to_thread.run_sync(
            lambda: wait_until(
                "drained", lambda: row_of(ray3, drained).report.state is NodeState.GONE
            )
        )
        assert state and row_of(ray3, drained).reason == "drained"
        for other in others:
            await close_session(other)


async def test_an_added_node_takes_new_sessions(ray3: Ray3) -> None:
    async with AsyncExitStack() as stack:
        ingress, url = await stack.enter_async_context(ingress_of(ray3))
        before = {r.report.name for r in ray3.rows()}
        # Ray starts a node only from the main thread (signal handlers): a short block
        host = ray3.cluster.add_node(**NODE_ARGS, resources={NODE_RESOURCE: 1})
        ray3.hosts.append(host)
        new = await trio.to_thread.run_sync(
            lambda: wait_until(
                "a new serving node",
                lambda: [
                    r.report.name
                    for r in ray3.rows()
                    if r.report.name not in before and r.report.state is NodeState.SERVING
                ],
            )
        )
        await wait_for("the new node in the table", lambda: ingress.placement.room(new[0]) > 0)
        c = await stack.enter_async_context(client_of(url))
        placed = node_id(await open_session(c))
        serving = [r for r in ray3.rows() if r.report.state is NodeState.SERVING]
        assert placed in {r.report.name for r in serving}
        opened = [c]
        while placed != new[0]:  # it has the most room once the others are as full
            c = await stack.enter_async_context(client_of(url))
            placed = node_id(await open_session(c))
            opened.append(c)
            assert len(opened) <= PER_NODE * len(serving)
        await echo(c, tone(3))
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(url + "/metrics")).text
            health = (await http.get(url + "/health")).json()
        assert f'duplex_cluster_placed_total{{node="{new[0]}"}} 1' in metrics
        assert health["sessions"]["capacity"] == PER_NODE * len(serving)
        for c in opened:
            await close_session(c)


async def test_a_controller_that_dies_is_restarted_and_takes_its_nodes_back(ray3: Ray3) -> None:
    """The controller's process killed (Ray restarts it): its nodes, detached actors, never
    stop; a session open through the ingress streams on, and the new controller lists every
    serving node again and places new sessions on them."""
    async with AsyncExitStack() as stack:
        _, url = await stack.enter_async_context(ingress_of(ray3))
        c = await stack.enter_async_context(client_of(url))
        created = await open_session(c)
        serving = {r.report.name for r in ray3.rows() if r.report.state is NodeState.SERVING}
        assert node_id(created) in serving
        ray.kill(ray3.controller, no_restart=False)  # its process ends; Ray starts it again

        def rows_again() -> list[NodeRow] | None:
            try:
                return ray3.rows()
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return None  # restarting

        await echo(c, tone(4))  # frames never pass the controller
        rows = await trio.to_thread.run_sync(
            lambda: wait_until(
                "the nodes taken back",
                lambda: (
                    (rows := rows_again())
                    and serving
                    <= {r.report.name for r in rows if r.report.state is NodeState.SERVING}
                    and rows
                ),
            )
        )
        assert all(r.reason == "" for r in rows if r.report.name in serving)
        await echo(c, tone(3, amplitude=0.3))
        c2 = await stack.enter_async_context(client_of(url))
        assert node_id(await open_session(c2)) in {r.report.name for r in ray3.rows()}
        await close_session(c2)
        await close_session(c)
