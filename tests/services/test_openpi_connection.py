"""One robot connection actor over an in-memory socket, under MockClock: the idle close both
ways, shutdown, and the answers it writes for each kind of frame."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from duplex.actors import ActorRef, open_actor_system
from duplex.metrics import MetricsRegistry
from duplex.models import PolicyRequest, PolicyRunner, RequestEngine
from duplex.models._driver import inline
from duplex.runtime import RequestEngines
from duplex.services.robots._serving import OVERLOADED, RobotService
from duplex.transport._connection import ShutDown
from duplex.transport._sockets import SocketGone
from duplex.wire._openpi import INTERNAL_ERROR, INVALID_PAYLOAD, pack, unpack

IDLE_S = 30.0


@dataclass
class MemorySocket:
    """A `FrameSocket` whose peer is the test: frames in through ``inbox``, out to ``sent``."""

    inbox_send: trio.MemorySendChannel[bytes | str | None] = field(init=False)
    inbox: trio.MemoryReceiveChannel[bytes | str | None] = field(init=False)
    outbox_send: trio.MemorySendChannel[bytes] = field(init=False)
    outbox: trio.MemoryReceiveChannel[bytes] = field(init=False)
    closed: tuple[int, str] | None = None
    left: tuple[int | None, str] | None = None

    def __post_init__(self) -> None:
        self.inbox_send, self.inbox = trio.open_memory_channel(16)
        self.outbox_send, self.outbox = trio.open_memory_channel(16)

    @property
    def open(self) -> bool:
        return self.closed is None and self.left is None

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        return self.left

    async def receive(self) -> bytes | str | None:
        frame = await self.inbox.receive()
        if frame is None:
            self.left = (1000, "")
        return frame

    async def send(self, frame: bytes) -> None:
        if not self.open:
            raise SocketGone
        await self.outbox_send.send(frame)

    async def close(self, code: int, reason: str) -> None:
        if self.open:
            self.closed = (code, reason)

    # the test's side
    async def request(self, value: Any) -> Any:
        await self.inbox_send.send(value if isinstance(value, bytes | str) else pack(value))
        return unpack(await self.outbox.receive())


class Policy:
    """Answers each request with its session and reset flag; a call takes ``delay_s``."""

    def __init__(self) -> None:
        self.calls: list[list[PolicyRequest]] = []

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"action_horizon": 2}

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[Any]:
        self.calls.append(list(requests))
        out: list[Any] = []
        for r in requests:
            if "boom" in r.observation:
                out.append(RuntimeError("secret detail"))
            elif "unsendable" in r.observation:
                out.append({"actions": object()})
            else:
                out.append(
                    {
                        "actions": np.zeros((2, 3), np.float32),
                        "session": r.session_id,
                        "reset": r.reset,
                    }
                )
        return out


class Live:
    def __init__(self) -> None:
        self.refs: set[ActorRef[Any]] = set()

    async def add(self, ref: ActorRef[Any]) -> None:
        self.refs.add(ref)

    def remove(self, ref: ActorRef[Any]) -> None:
        self.refs.discard(ref)


@asynccontextmanager
async def robot(
    *, delay_s: float = 0.0, max_queue: int = 1024, max_batch: int = 8
) -> AsyncIterator[tuple[MemorySocket, RobotService, Policy, trio.Nursery]]:
    """A robot service with one engine and one connected socket (handshake already read)."""
    policy = Policy()

    async def offload(fn: Any) -> Any:
        if delay_s:
            await trio.sleep(delay_s)
        return fn()

    engine = RequestEngine(
        PolicyRunner(policy, max_batch=max_batch),
        max_wait_s=0.002,
        max_queue=max_queue,
        offload=offload if delay_s else inline,
    )
    registry = MetricsRegistry()
    async with open_actor_system(registry=registry) as system, trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        requests = RequestEngines(["policy"], registry)
        service = RobotService(system, Live(), requests, registry, idle_timeout_s=IDLE_S)
        await requests.started(engine)
        socket = MemorySocket()
        nursery.start_soon(service.connect, socket)
        assert unpack(await socket.outbox.receive()) == {"action_horizon": 2}
        yield socket, service, policy, nursery
        nursery.cancel_scope.cancel()


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_an_idle_robot_is_closed_after_the_timeout(clock: trio.testing.MockClock) -> None:
    async with robot() as (socket, _service, _, _):
        start = trio.current_time()
        with trio.fail_after(IDLE_S + 5):
            while socket.closed is None:
                await trio.sleep(0.5)
        assert socket.closed == (1000, "idle_timeout")
        assert trio.current_time() - start == pytest.approx(IDLE_S, abs=0.6)


async def test_a_busy_robot_is_never_closed(clock: trio.testing.MockClock) -> None:
    """Frames every 20 s for 200 s, and inferences that take 40 s: still open."""
    async with robot(delay_s=40.0) as (socket, _, policy, _):
        for _ in range(5):
            await trio.sleep(20.0)
            reply = await socket.request({"observation/state": np.zeros(3, np.float32)})
            assert reply["actions"].shape == (2, 3)
        assert socket.open and len(policy.calls) == 5
        await trio.sleep(IDLE_S - 1)
        assert socket.open  # quiet, but not yet for the whole timeout


async def test_a_zero_timeout_never_closes(clock: trio.testing.MockClock) -> None:
    async with robot() as (socket, service, _, _):
        service.idle_timeout_s = 0  # read per frame wait: the next wait has none
        await socket.request({})
        await trio.sleep(10 * IDLE_S)
        assert socket.open


async def test_shutdown_closes_with_1001(clock: trio.testing.MockClock) -> None:
    async with robot() as (socket, service, _, _):
        (ref,) = service.connections.refs
        ref.tell_nowait(ShutDown())
        with trio.fail_after(5):
            while socket.closed is None:
                await trio.sleep(0.01)
        assert socket.closed == (1001, "server_shutdown")


async def test_each_frame_gets_its_answer_and_the_connection_stays_usable(
    clock: trio.testing.MockClock,
) -> None:
    async with robot() as (socket, _, _policy, _):
        first = await socket.request({"session_id": "ep1"})
        assert (first["session"], first["reset"]) == ("ep1", True)
        assert set(first["server_timing"]) == {"infer_ms"}
        bad = {"type": "error", "message": INVALID_PAYLOAD}
        assert await socket.request(b"\x00not msgpack") == bad
        assert await socket.request('{"endpoint": "infer"}') == bad
        failed = await socket.request({"boom": 1})
        assert failed == {"type": "error", "message": INTERNAL_ERROR}  # no traceback, no cause
        assert await socket.request({"unsendable": 1}) == failed
        second = await socket.request({})
        assert (second["session"], second["reset"]) == ("ep1", False)
        assert "prev_total_ms" in second["server_timing"]
        assert await socket.request({"endpoint": "reset"}) == {"status": "reset successful"}
        third = await socket.request({})
        assert (third["session"], third["reset"]) == ("default", True)
        assert socket.open


async def test_an_overloaded_engine_answers_and_recovers(clock: trio.testing.MockClock) -> None:
    """A queue of one, already taken by another robot's request: this one is refused."""
    async with robot(delay_s=1.0, max_queue=1, max_batch=1) as (socket, service, _, nursery):
        engine = service.engine
        assert engine is not None

        async def other() -> None:
            await engine.submit(PolicyRequest({}))

        nursery.start_soon(other)
        await trio.sleep(0.5)  # the other request runs; a second one waits
        nursery.start_soon(other)
        await trio.testing.wait_all_tasks_blocked()
        assert await socket.request({}) == {"type": "error", "message": OVERLOADED}
        await trio.sleep(5)
        assert (await socket.request({}))["actions"].shape == (2, 3)
