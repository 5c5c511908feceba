"""Session shards without processes: ids, the split of ``max_sessions``, merged metrics, and
how a connection worker places each socket (``LinkBackend``)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from duplex.actors import open_actor_system
from duplex.config import load_config
from duplex.metrics import Family, MetricsRegistry, Sample, merge_labelled, render
from duplex.sessions import SessionCreate, SessionResume, new_session_id, shard_of
from duplex.topology._frontend import LinkBackend, Relay
from duplex.topology._link import (
    WINDOW,
    CloseRemoteSocket,
    Connected,
    Consumed,
    FromSocket,
    Link,
    Load,
)
from duplex.topology._server import open_backend, shard_max_sessions

# -- session ids ---------------------------------------------------------------


@given(st.integers(0, 63), st.binary(min_size=16, max_size=16))
def test_shard_of_reads_the_shard_a_session_id_names(shard: int, raw: bytes) -> None:
    made = new_session_id(lambda n: raw, shard)
    assert made == f"duplex-s{shard}-{raw.hex()}"
    assert shard_of(made) == shard
    assert shard_of(new_session_id(lambda n: raw)) is None


@pytest.mark.parametrize(
    "session_id",
    [
        # one process: no shard in the id (a stable test id: xdist workers collect alike)
        pytest.param(f"duplex-{os.urandom(16).hex()}", id="duplex-random"),
        "duplex-" + "0" * 32,
        "",
        "duplex-s",
        "duplex-s-1-abc",
        "duplex-sx-abc",
        "xduplex-s1-abc",  # the prefix only where it starts
        "DUPLEX-S1-abc",
        "resp_123",
        "duplex-s" + "1" * 5000 + "-abc",  # a client's crafted id: no huge int parse
        "duplex-s123-abc",  # shards are 1..64
        "duplex-s\u0661-abc",  # a non-ASCII digit
    ],
)
def test_shard_of_any_other_id_is_none(session_id: str) -> None:
    assert shard_of(session_id) is None


# -- max_sessions over shards --------------------------------------------------


@given(st.integers(1, 10_000), st.integers(1, 64))
def test_shard_parts_of_max_sessions_sum_to_it_and_differ_by_at_most_one(
    total: int, shards: int
) -> None:
    parts = [shard_max_sessions(total, shards, i) for i in range(shards)]
    assert sum(parts) == total
    assert max(parts) - min(parts) <= 1
    assert parts == sorted(parts, reverse=True)  # the remainder goes to the first shards
    if total >= shards:  # what config validation demands: every shard admits someone
        assert min(parts) >= 1


@given(st.integers(1, 64))
def test_no_cap_stays_no_cap_on_every_shard(shards: int) -> None:
    assert [shard_max_sessions(0, shards, i) for i in range(shards)] == [0] * shards


def test_shard_parts_examples() -> None:
    assert [shard_max_sessions(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert [shard_max_sessions(4, 2, i) for i in range(2)] == [2, 2]
    assert [shard_max_sessions(5, 5, i) for i in range(5)] == [1] * 5


# -- metrics of several processes ----------------------------------------------


def _registry(live: float, *, kind: str = "gauge") -> MetricsRegistry:
    reg = MetricsRegistry()
    opened = reg.counter("opened_total", "Sessions admitted", ["model"])
    opened.inc(3, model="loopback")
    reg.add_collector("live", kind, "Sessions now", lambda: [Sample("live", {}, live)])
    return reg


def test_merge_labelled_gives_each_family_once_with_every_parts_samples_labelled() -> None:
    first, second = _registry(2), _registry(5)
    second.gauge("only_here", "one shard's metric").set(1)
    text = render(
        merge_labelled([({"shard": "0"}, first.families()), ({"shard": "1"}, second.families())])
    )
    assert text.count("# TYPE live gauge") == 1 and text.count("# HELP live ") == 1
    assert text.count("# TYPE opened_total counter") == 1
    assert re.findall(r"^live\{.*$", text, re.M) == ['live{shard="0"} 2', 'live{shard="1"} 5']
    assert 'opened_total{model="loopback",shard="0"} 3' in text
    assert 'opened_total{model="loopback",shard="1"} 3' in text
    assert 'only_here{shard="1"} 1' in text
    assert not re.search(r"^\w+ ", text, re.M)  # no sample without its shard
    # families in the order first seen; one part's own family after the shared ones
    types = re.findall(r"^# TYPE (\w+)", text, re.M)
    assert types == ["opened_total", "live", "only_here"]


def test_merge_labelled_keeps_the_first_kind_and_drops_a_mismatched_parts_samples() -> None:
    gauge, counter = _registry(2), _registry(7, kind="counter")
    merged = merge_labelled(
        [({"shard": "0"}, gauge.families()), ({"shard": "1"}, counter.families())]
    )
    (live,) = [f for f in merged if f.name == "live"]
    assert live.kind == "gauge"
    assert live.samples == [Sample("live", {"shard": "0"}, 2)]
    (opened,) = [f for f in merged if f.name == "opened_total"]
    assert len(opened.samples) == 2  # the families that agree are merged as usual


def test_merge_labelled_does_not_touch_its_parts() -> None:
    family = Family("x", "gauge", "x", [Sample("x", {"k": "v"}, 1)])
    merged = merge_labelled([({"shard": "0"}, [family]), ({"shard": "1"}, [family])])
    assert family.samples == [Sample("x", {"k": "v"}, 1)]
    assert merged[0].samples == [
        Sample("x", {"shard": "0", "k": "v"}, 1),
        Sample("x", {"shard": "1", "k": "v"}, 1),
    ]


def test_render_of_families_is_the_registrys_own_render() -> None:
    reg = _registry(4)
    reg.histogram("t_seconds", "time", buckets=(0.1,)).observe(0.05)
    assert render(reg.families()) == reg.render()
    assert render(merge_labelled([({}, reg.families())])) == reg.render()  # no labels: same


# -- placing sockets on shards (a worker's LinkBackend) --------------------------


def _link() -> Link:
    left, _ = trio.testing.memory_stream_pair()
    return Link(left)


def backend_of(*loads: tuple[int, int] | None) -> LinkBackend:
    """A worker's backend with one shard per load ``(live, capacity)``; ``None``: down."""
    backend = LinkBackend(_link(), len(loads))
    for shard, load in zip(backend.shards, loads, strict=True):
        if load is None:
            shard.link = None
        else:
            shard.link = shard.link or _link()
            shard.live, shard.capacity = load
    return backend


def resume_of(session_id: str) -> SessionResume:
    return SessionResume(session_id=session_id, resume_token="token")


def test_a_new_session_goes_to_the_shard_with_the_most_free() -> None:
    backend = backend_of((8, 10), (3, 10), (5, 10))
    assert backend._roomiest().index == 1
    assert [s.live for s in backend.shards] == [8, 4, 5]  # counted taken at once


def test_free_room_is_what_counts_not_live_sessions() -> None:
    backend = backend_of((3, 4), (9, 16))  # shard 0 has fewer sessions, shard 1 more room
    assert backend._roomiest().index == 1


def test_counting_each_new_session_at_once_spreads_a_burst_before_any_load_arrives() -> None:
    backend = backend_of((0, 4), (0, 4), (0, 4))
    assert [backend._roomiest().index for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_load_replaces_the_count_made_at_once() -> None:
    backend = backend_of((0, 4), (0, 4))
    for _ in range(3):
        backend._roomiest()
    assert [s.live for s in backend.shards] == [2, 1]
    backend.route(Load(0, 4), 0)  # shard 0 admitted none of them after all
    backend.route(Load(3, 4), 1)
    assert [(s.live, s.capacity) for s in backend.shards] == [(0, 4), (3, 4)]
    assert backend._roomiest().index == 0


def test_a_down_shard_gets_no_new_session() -> None:
    backend = backend_of((9, 10), None, (8, 10))
    assert [backend._roomiest().index for _ in range(4)] == [2, 0, 2, 0]
    assert backend.shards[1].live == 0


def test_a_resume_goes_to_the_shard_its_session_id_names_and_counts_nothing() -> None:
    backend = backend_of((0, 10), (10, 10), (0, 10))
    for shard in (0, 1, 2):
        session_id = f"duplex-s{shard}-{os.urandom(16).hex()}"
        assert backend._owner(resume_of(session_id)).index == shard
    assert [s.live for s in backend.shards] == [0, 10, 0]  # full or not: it is its owner


@pytest.mark.parametrize(
    "session_id",
    [
        f"duplex-s1-{'a' * 32}",  # its shard is down (restarting): shard 0 says it expired
        f"duplex-s3-{'a' * 32}",  # no such shard here
        f"duplex-{'a' * 32}",  # not a shard's id at all
    ],
)
def test_a_resume_whose_owner_is_not_reachable_goes_to_shard_0(session_id: str) -> None:
    backend = backend_of((5, 10), None, (0, 10))
    assert backend._owner(resume_of(session_id)).index == 0
    assert [s.live for s in backend.shards] == [5, 0, 0]


def test_any_other_first_event_opens_a_session_on_the_roomiest_shard() -> None:
    backend = backend_of((5, 10), (1, 10))
    assert backend._owner(SessionCreate()).index == 1
    assert backend.shards[1].live == 2


def test_a_gone_shard_costs_its_own_sockets_only() -> None:
    backend = backend_of((0, 10), (0, 10), (0, 10))
    relays = {}
    for conn, shard in enumerate([0, 1, 2, 1]):
        link = backend.shards[shard].link
        assert link is not None
        relays[conn] = backend.relays[conn] = Relay(conn, None, link, shard)  # type: ignore[arg-type]
    backend.shard_gone(1)

    def pending(relay: Relay) -> list[Any]:
        out = []
        while True:
            try:
                out.append(relay.outbox.receive_nowait())
            except trio.WouldBlock:
                return out

    assert {conn: pending(r) for conn, r in relays.items()} == {
        0: [],
        1: [CloseRemoteSocket(1, 1011, "internal_error")],
        2: [],
        3: [CloseRemoteSocket(3, 1011, "internal_error")],
    }
    backend.shard_gone()  # the server itself is gone: every socket
    assert all(len(pending(r)) == 1 for r in relays.values())


# -- LinkBackend.connect: holding a socket for its first event -------------------


class HeldSocket:
    """A client socket whose frames the test hands in."""

    def __init__(self) -> None:
        self.put, self.frames = trio.open_memory_channel[Any](math.inf)
        self.open = True
        self.initial_options = None

    async def receive(self) -> Any:
        return await self.frames.receive()

    async def send(self, event: Any, seq: int | None) -> None:
        pass

    async def close(self, code: int, reason: str) -> None:
        self.open = False


class Shards:
    """A worker's backend over real links, and the messages each shard received."""

    def __init__(self, backend: LinkBackend) -> None:
        self.backend = backend
        self.received: list[list[Any]] = [[] for _ in backend.shards]

    async def until(self, shard: int, count: int) -> list[Any]:
        with trio.fail_after(5):
            while len(self.received[shard]) < count:
                await trio.sleep(0.01)
        return self.received[shard]


@asynccontextmanager
async def shards_over_links(
    count: int, *, first_event_timeout_s: float = 0.0
) -> AsyncIterator[Shards]:
    async with trio.open_nursery() as nursery:
        links = []
        for _ in range(count):
            ours, theirs = trio.testing.memory_stream_pair()
            links.append((Link(ours), Link(theirs)))
        backend = LinkBackend(links[0][0], count, first_event_timeout_s)
        shards = Shards(backend)

        async def collect(index: int, link: Link) -> None:
            async for message in link.messages():
                shards.received[index].append(message)

        for index, (ours, theirs) in enumerate(links):
            backend.shards[index].link = ours
            backend.shards[index].capacity = 10
            nursery.start_soon(ours.send_loop)
            nursery.start_soon(collect, index, theirs)
        yield shards
        nursery.cancel_scope.cancel()


async def test_a_duplex_socket_is_held_until_its_resume_names_the_shard(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with shards_over_links(2, first_event_timeout_s=10) as shards, trio.open_nursery() as n:
        socket = HeldSocket()
        n.start_soon(lambda: shards.backend.connect(socket, autostart=False))
        await trio.sleep(3)
        assert shards.received == [[], []]  # nothing said yet: no shard hears of it
        first = resume_of(f"duplex-s1-{'b' * 32}")
        socket.put.send_nowait(first)
        connected, delivered = await shards.until(1, 2)
        assert connected == Connected(0, False, None, pytest.approx(3.0))
        assert delivered == FromSocket(0, first)
        assert shards.received[0] == []
        assert [s.live for s in shards.backend.shards] == [0, 0]
        n.cancel_scope.cancel()


async def test_a_socket_silent_past_the_timeout_goes_to_shard_0_and_counts_as_no_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with shards_over_links(2, first_event_timeout_s=0.5) as shards, trio.open_nursery() as n:
        shards.backend.shards[0].live = 9  # shard 1 has far more room
        n.start_soon(lambda: shards.backend.connect(HeldSocket(), autostart=False))
        (connected,) = await shards.until(0, 1)
        # shard 0 refuses it with first_event_timeout: only a moment of the timeout is left
        assert connected == Connected(0, False, None, pytest.approx(0.5))
        assert shards.received[1] == []
        assert [s.live for s in shards.backend.shards] == [9, 0]  # nothing counted taken
        n.cancel_scope.cancel()


async def test_a_socket_that_leaves_before_its_first_event_reaches_no_shard(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with shards_over_links(2, first_event_timeout_s=5) as shards:
        socket = HeldSocket()
        socket.put.send_nowait(None)
        await shards.backend.connect(socket, autostart=False)
        await trio.sleep(1)
        assert shards.received == [[], []]
        assert [s.live for s in shards.backend.shards] == [0, 0]
        assert shards.backend.relays == {}


async def test_an_autostart_socket_opens_on_the_roomiest_shard_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with shards_over_links(3) as shards, trio.open_nursery() as n:
        for shard, live in zip(shards.backend.shards, [4, 2, 3], strict=True):
            shard.live = live
        n.start_soon(lambda: shards.backend.connect(HeldSocket(), autostart=True))
        (connected,) = await shards.until(1, 1)
        assert connected == Connected(0, True, None, 0.0)
        assert [s.live for s in shards.backend.shards] == [4, 3, 3]
        n.cancel_scope.cancel()


async def test_with_one_shard_a_socket_is_not_held() -> None:
    async with shards_over_links(1, first_event_timeout_s=30) as shards, trio.open_nursery() as n:
        n.start_soon(lambda: shards.backend.connect(HeldSocket(), autostart=False))
        (connected,) = await shards.until(0, 1)
        assert connected == Connected(0, False, None, 0.0)
        n.cancel_scope.cancel()


async def test_a_worker_relays_at_most_a_window_of_frames_the_shard_has_not_taken(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The client sends far more than a window and the shard takes nothing: once every
    task is blocked, exactly ``WINDOW`` frames crossed and the rest wait in the socket;
    each ``Consumed`` lets exactly that many more cross."""
    async with shards_over_links(1) as shards, trio.open_nursery() as n:
        socket = HeldSocket()
        frames = [SessionCreate(event_id=f"e{i}") for i in range(3 * WINDOW)]
        for frame in frames:
            socket.put.send_nowait(frame)
        n.start_soon(lambda: shards.backend.connect(socket, autostart=True))
        await trio.testing.wait_all_tasks_blocked()
        crossed = [m.received for m in shards.received[0] if isinstance(m, FromSocket)]
        assert crossed == frames[:WINDOW]  # in order, and no further: the worker waits
        shards.backend.route(Consumed(0, WINDOW // 2))
        await trio.testing.wait_all_tasks_blocked()
        crossed = [m.received for m in shards.received[0] if isinstance(m, FromSocket)]
        assert crossed == frames[: WINDOW + WINDOW // 2]
        n.cancel_scope.cancel()


class SilentSocket:
    """A client socket that never speaks; records what the server sends and its close."""

    def __init__(self) -> None:
        self.open = True
        self.initial_options = None
        self.peer_close = None
        self.sent: list[Any] = []
        self.closed_with: tuple[int, str] | None = None
        self.closed = trio.Event()

    async def receive(self) -> Any:
        await trio.sleep_forever()

    async def send(self, event: Any, seq: int | None) -> None:
        self.sent.append(event)

    async def close(self, code: int, reason: str) -> None:
        self.open, self.closed_with = False, (code, reason)
        self.closed.set()


@pytest.mark.parametrize("waited", [0.0, 0.75, 1.0, 5.0])
async def test_a_shard_times_out_what_the_worker_left_of_the_first_event_timeout(
    waited: float, autojump_clock: trio.testing.MockClock
) -> None:
    """The worker held the socket ``waited`` s for its first event (``Connected.waited_s``):
    the session process times it out after the rest of the timeout, not a whole one again
    (and at once, never "no timeout", when nothing is left)."""
    timeout = 1.0
    overrides = {"server.first_event_timeout_s": timeout, "server.realtime_vad": "energy"}
    config = load_config(env={}, overrides=overrides)
    async with (
        open_actor_system() as system,
        open_backend(config, system, MetricsRegistry()) as backend,
    ):
        socket = SilentSocket()
        began = trio.current_time()
        await backend.connect(socket, autostart=False, waited_s=waited)
        await socket.closed.wait()
        took = trio.current_time() - began
    assert socket.closed_with == (1008, "first_event_timeout")
    assert [event.code for event in socket.sent] == ["first_event_timeout"]
    assert took == pytest.approx(max(timeout - waited, 1e-3))
