"""The engine link: its framing, and an engine serving two session processes' links.

The engine side (``EngineServer``) and the session side (``EngineConnection`` and its
``RemoteEngine``) run in this process over a real Unix socket, with a loopback engine
of three slots, so admission across two linked processes is visible.
"""

from __future__ import annotations

import dataclasses
import pickle
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from duplex.exceptions import (
    EngineUnavailable,
    PromptUnsupported,
    RequestFailed,
    RequestsOverloaded,
)
from duplex.metrics import MetricsRegistry
from duplex.models import (
    LOOPBACK_SPEC,
    Engine,
    EngineDriver,
    FrameOutput,
    LoopbackRunner,
    ModelRunner,
    ModelSpec,
    RequestEngine,
    SamplingRequest,
    Slack,
    SlotEngine,
    SlotHandle,
    SlotOutput,
    SlotPrompt,
    StepOutput,
    StepPlan,
    UnitGate,
)
from duplex.runtime import RequestEngines
from duplex.topology._engine_client import EngineConnection, RemoteEngine
from duplex.topology._engine_link import (
    CommandBatch,
    Commands,
    OpenSlot,
    Outputs,
    PushPcm,
    PushVideo,
    Reset,
    decode,
    decode_outputs,
    encode_outputs,
)
from duplex.topology._engine_process import EngineServer
from duplex.topology._link import HEADER, LinkBroken

from ..helpers import wait_until

SPEC = dataclasses.replace(LOOPBACK_SPEC, max_slots=3, tick_phases=1)
FRAME = SPEC.frame_samples

# -- framing -------------------------------------------------------------------

texts = st.text(max_size=20)
pcm16s = st.binary(max_size=64).map(lambda b: b[: len(b) // 2 * 2])


@st.composite
def outputs(draw: st.DrawFn) -> SlotOutput:
    slot = draw(st.integers(0, 1000))
    video = draw(st.lists(texts, max_size=3))
    frame = FrameOutput(
        slot,
        np.zeros(0, np.float32),
        draw(texts),
        speaking=draw(st.booleans()),
        end_of_turn=draw(st.booleans()),
        video_frame_ids=tuple(video),
        latest_video_pts_ms=draw(st.none() | st.integers(0, 10**9)) if video else None,
        holds_input=draw(st.booleans()),
    )
    handle = SlotHandle(slot, "owner", draw(st.integers(0, 2**31)))
    return SlotOutput(
        handle,
        draw(st.integers(0, 2**40)),
        7,
        1.5,
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**20)),
        frame,
        draw(pcm16s),
    )


@given(
    st.lists(
        st.tuples(outputs(), st.integers(0, 100)),
        min_size=1,
        max_size=5,
        unique_by=lambda o: o[0].handle.slot,
    )
)
def test_a_tick_of_outputs_crosses_the_link_unchanged(items: list[tuple[SlotOutput, int]]) -> None:
    framed = encode_outputs(items)
    (size,) = HEADER.unpack_from(framed)
    assert size == len(framed) - HEADER.size
    handles = {(o.handle.slot, o.handle.generation): o.handle for o, _ in items}
    decoded = decode_outputs(framed[HEADER.size :], handles)
    assert len(decoded) == len(items)
    for (got, rejected), (sent, sent_rejected) in zip(decoded, items, strict=True):
        assert rejected == sent_rejected
        assert got.handle is sent.handle
        assert got.pcm16 == sent.pcm16
        assert dataclasses.replace(got.frame, pcm=sent.frame.pcm) == sent.frame
        same = ("epoch", "tick", "at", "position", "input_samples")
        assert all(getattr(got, name) == getattr(sent, name) for name in same)
    # a slot closed meanwhile is left out, the rest still decode
    first = items[0][0].handle
    del handles[(first.slot, first.generation)]
    assert len(decode_outputs(framed[HEADER.size :], handles)) == len(items) - 1


commands = st.one_of(
    st.builds(
        PushPcm,
        st.integers(0, 300),
        st.integers(0, 2**31),
        st.lists(st.floats(-1, 1, width=32), max_size=8).map(lambda v: np.array(v, np.float32)),
    ),
    st.builds(
        Reset, st.integers(0, 300), st.integers(0, 2**31), st.integers(0, 2**40), st.booleans()
    ),
    st.builds(
        PushVideo,
        st.integers(0, 300),
        st.integers(0, 2**31),
        texts,
        st.integers(0, 2**40),
        st.binary(max_size=16),
    ),
)


@given(st.lists(commands, max_size=8))
def test_a_batch_of_commands_keeps_its_order(sent: list[PushPcm | PushVideo | Reset]) -> None:
    batch = CommandBatch()
    for command in sent:
        handle = SlotHandle(command.slot, "x", command.generation)
        match command:
            case PushPcm(_, _, pcm):
                batch.pcm(handle, pcm)
            case Reset(_, _, epoch, clear):
                batch.reset(handle, epoch, clear)
            case PushVideo(_, _, frame_id, pts, payload):
                batch.video(handle, frame_id, pts, payload)
    framed = batch.take()
    assert not batch
    message = decode(framed[HEADER.size :])
    assert isinstance(message, Commands)
    got = list(message)
    assert len(got) == len(sent)
    for a, b in zip(got, sent, strict=True):
        if isinstance(a, PushPcm):
            assert isinstance(b, PushPcm) and (a.slot, a.generation) == (b.slot, b.generation)
            assert np.array_equal(a.pcm, b.pcm)
        else:
            assert a == b


@given(st.binary(max_size=64))
def test_any_bytes_are_a_message_or_a_broken_link(body: bytes) -> None:
    try:
        message = decode(body)
        if isinstance(message, Commands):
            list(message)
        elif isinstance(message, Outputs):
            message.entries({})
    except LinkBroken:
        pass
    except Exception as exc:  # anything else would end the process, not the link
        pytest.fail(f"{body!r}: {exc!r}")


# -- an engine and two session processes over a Unix socket --------------------


class Host:
    """The session hub's part, recorded: engines handed over and taken away."""

    def __init__(self) -> None:
        self.started: list[SlotEngine] = []
        self.stopped = 0
        self.lost: list[str] = []
        self.changed = trio.Event()
        self.sleeping = False

    async def engine_started(self, engine: SlotEngine, index: int = 0) -> None:
        self.started.append(engine)
        self.changed.set()

    def engine_stopped(self, index: int, engine: SlotEngine) -> None:
        self.stopped += 1
        self.changed.set()

    async def engine_lost(self, index: int, reason: str) -> None:
        self.lost.append(reason)


@asynccontextmanager
async def engine_at(
    path: str, runner: ModelRunner | None = None, requests: RequestEngines | None = None
) -> AsyncIterator[EngineServer]:
    server = EngineServer(SPEC, 0, requests)
    driver = EngineDriver(Engine(runner or LoopbackRunner(SPEC), max_input_frames=8))
    async with trio.open_nursery() as nursery:
        await server.engine_started(driver)
        await nursery.start(driver.run)
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(path)
        listener.listen(8)

        async def accept() -> None:
            with listener:
                while True:
                    sock, _ = await listener.accept()
                    nursery.start_soon(server.serve, sock)

        nursery.start_soon(accept)
        yield server
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def linked(
    path: str, requests: RequestEngines | None = None
) -> AsyncIterator[tuple[RemoteEngine, Host]]:
    host = Host()
    connection = EngineConnection(SPEC, 0, path, host, requests)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        with trio.fail_after(5):
            await connection.ready.wait()
        engine = host.started[-1]
        assert isinstance(engine, RemoteEngine)
        yield engine, host
        nursery.cancel_scope.cancel()


def tone(value: float, frames: int) -> np.ndarray:
    return np.full(frames * FRAME, value, np.float32)


async def received(channel: trio.MemoryReceiveChannel[SlotOutput], frames: int) -> bytes:
    out = b""
    with trio.fail_after(10):
        while len(out) < frames * FRAME * 2:
            out += (await channel.receive()).pcm16
    return out


async def test_two_session_processes_share_the_engine_its_admission_and_hear_only_themselves(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "engine.sock")
    async with engine_at(path) as server, linked(path) as (a, _), linked(path) as (b, _):
        channels = [trio.open_memory_channel[SlotOutput](64) for _ in range(4)]
        ha = await a.open_slot("a1", channels[0][0])
        hb = await b.open_slot("b1", channels[1][0])
        hc = await b.open_slot("b2", channels[2][0])
        assert None not in (ha, hb, hc)
        assert await a.open_slot("a2", channels[3][0]) is None  # three slots, all taken
        assert a.capacity().live == 3 and not a.capacity().admits
        # each slot hears its own echo (the loopback delays by 3 frames)
        for engine, handle, value in ((a, ha, 0.25), (b, hb, -0.5), (b, hc, 0.75)):
            engine.push_input(handle, tone(value, 6))
        expected = [tone(v, 6) for v in (0.25, -0.5, 0.75)]
        for (_, receive), pcm in zip(channels[:3], expected, strict=True):
            heard = np.frombuffer(await received(receive, 9), "<i2")
            assert np.count_nonzero(heard) == 6 * FRAME
            assert np.allclose(heard[heard != 0] / 32767, pcm[0], atol=1e-3)
        # one slot closes: the engine admits again, for either process
        assert b.detach(hb)
        with trio.fail_after(5):
            while (handle := await a.open_slot("a2", channels[3][0])) is None:
                await trio.sleep(0.05)
        assert handle is not None
        assert sum(len(link.handles) for link in server.links) == 3


async def test_a_session_process_gone_frees_its_slots_and_an_engine_gone_is_reported(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "engine.sock")
    async with engine_at(path) as server:
        send, _ = trio.open_memory_channel[SlotOutput](64)
        async with linked(path) as (a, _):
            assert await a.open_slot("a1", send) is not None
            assert await a.open_slot("a2", send) is not None
            with trio.fail_after(5):
                while sum(len(link.handles) for link in server.links) != 2:
                    await trio.sleep(0.01)
        # that process's link ended: its two slots are back in the pool
        with trio.fail_after(5):
            while server.links:
                await trio.sleep(0.01)
        async with linked(path) as (b, host):
            handles: list[SlotHandle] = []
            with trio.fail_after(5):  # ids return to the pool once the next step dropped them
                while len(handles) < 3:
                    handle = await b.open_slot(f"b{len(handles)}", send)
                    if handle is None:
                        await trio.sleep(0.02)
                    else:
                        handles.append(handle)
            for scope in server.links.values():
                scope.cancel()  # as when the engine restarts: every link is closed
            with trio.fail_after(5):
                while host.stopped == 0:
                    await host.changed.wait()
                    host.changed = trio.Event()
            assert not b.connected and not b.capacity().admits
            assert await b.open_slot("b4", send) is None
            assert b.push_input(handles[0], tone(0.1, 2)).frames_rejected == 0  # dropped, counted
            assert b.dropped_disconnected == 2
            # the connection comes back by itself and hands over a new engine
            with trio.fail_after(5):
                while len(host.started) < 2:
                    await host.changed.wait()
                    host.changed = trio.Event()
            assert host.started[-1] is not b
            assert host.lost == ["the engine process exited"]


class Recording:
    """The loopback, keeping the prompts its plans carry (what the engine handed over)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.inner = LoopbackRunner(spec)
        self.prompts: list[SlotPrompt] = []

    @property
    def spec(self) -> ModelSpec:
        return self.inner.spec

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        self.prompts.extend(plan.new_prompts.values())
        return self.inner.execute(plan)


async def test_a_sessions_sampling_crosses_the_link_to_the_runner_unchanged(
    tmp_path: Path,
) -> None:
    sampling = SamplingRequest(text_temperature=0.25, text_top_k=7, audio_seed=-3, pad_mult=0.5)
    prompt = SlotPrompt(sampling=sampling)
    opened = OpenSlot(1, "a", prompt)
    assert decode(pickle.dumps(opened, protocol=pickle.HIGHEST_PROTOCOL)) == opened
    path = str(tmp_path / "engine.sock")
    runner = Recording(SPEC)
    send, _ = trio.open_memory_channel[SlotOutput](64)
    async with engine_at(path, runner), linked(path) as (a, _):
        # the loopback takes no prompt, but a sampling alone is no prompt to refuse
        assert await a.open_slot("a", send, prompt=prompt) is not None
        with pytest.raises(PromptUnsupported):
            await a.open_slot("b", send, prompt=SlotPrompt(text="be brief", sampling=sampling))
        with trio.fail_after(5):
            while not runner.prompts:
                await trio.sleep(0.01)
        assert runner.prompts == [prompt]


# -- request engines hosted by the engine process -------------------------------------------


class Doubler:
    """A request runner with ``units`` units of ``unit_s`` per batch (a gate between them)."""

    name = "doubler"
    max_batch = 4
    metadata = {"kind": "test"}

    def __init__(self, units: int = 1, unit_s: float = 0.0) -> None:
        self.units = units
        self.unit_s = unit_s
        self.started = threading.Event()

    def run_batch(self, requests: Sequence[Any], gate: UnitGate) -> list[Any]:
        self.started.set()
        for unit in range(self.units):
            if unit:
                gate.next_unit()
            time.sleep(self.unit_s)
        return [ValueError("odd") if r == "odd" else np.full(3, r) * 2 for r in requests]


@asynccontextmanager
async def hosting(
    path: str, runner: Doubler, *, max_queue: int = 64
) -> AsyncIterator[tuple[EngineServer, RequestEngine[Any, Any]]]:
    """An engine process's side: its engine and one request engine in its slack."""
    slack = Slack()
    hosted = RequestEngines([runner.name])
    engine = RequestEngine(runner, max_wait_s=0.0, max_queue=max_queue, slack=slack)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await hosted.started(engine)
        async with engine_at(path, requests=hosted) as server:
            yield server, engine
        nursery.cancel_scope.cancel()


async def test_requests_reach_the_engine_process_runner_and_each_gets_its_answer(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "engine.sock")
    registry = MetricsRegistry()
    async with hosting(path, Doubler()) as (_, engine):
        mine = RequestEngines(["doubler"], registry)
        async with linked(path, mine), linked(path, RequestEngines(["doubler"])) as (_, _):
            service = mine.get("doubler")
            assert service is not None and service.metadata == {"kind": "test"}
            answers: dict[int, Any] = {}

            async def ask(value: int) -> None:
                answers[value] = await service.submit(value)

            async with trio.open_nursery() as nursery:
                for value in range(6):
                    nursery.start_soon(ask, value)
            assert {k: v.tolist() for k, v in answers.items()} == {k: [2 * k] * 3 for k in range(6)}
            with pytest.raises(RequestFailed, match="ValueError"):
                await service.submit("odd")  # fails alone, with its cause named
            assert (await service.submit_timed(4)).result.tolist() == [8, 8, 8]
            with trio.fail_after(5):  # the engine process's counters come with its status
                while (service.statistics() or engine.statistics()).batcher.submitted < 8:
                    await trio.sleep(0.05)
            assert 'duplex_requests_total{runner="doubler"} 8' in registry.render()
        assert mine.get("doubler") is None  # the link ended: nothing serves it here


async def test_a_client_that_leaves_withdraws_its_request_in_the_engine_process(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "engine.sock")
    runner = Doubler(units=200, unit_s=0.01)
    async with hosting(path, runner) as (_, engine):
        mine = RequestEngines(["doubler"])
        async with linked(path, mine):
            service = mine.get("doubler")
            assert service is not None
            with trio.move_on_after(0.3):
                await service.submit(1)
            with trio.fail_after(10):  # stopped at its next unit, not after 200
                while engine.statistics().stopped_batches == 0:
                    await trio.sleep(0.02)
            assert engine.statistics().orphaned == 1
            assert (await service.submit(2)).tolist() == [4, 4, 4]  # the engine is free again


async def test_a_full_queue_in_the_engine_process_refuses_and_recovers(tmp_path: Path) -> None:
    path = str(tmp_path / "engine.sock")
    runner = Doubler(units=30, unit_s=0.01)
    runner.max_batch = 1
    async with hosting(path, runner, max_queue=1) as (_, engine):
        mine = RequestEngines(["doubler"])
        async with linked(path, mine):
            service = mine.get("doubler")
            assert service is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(service.submit, 1)  # runs
                await trio.to_thread.run_sync(runner.started.wait)
                nursery.start_soon(service.submit, 2)  # waits in a queue of one
                await wait_until(
                    lambda: engine.statistics().batcher.queued == 1,
                    timeout_s=10,
                    what="request 2 waits in the engine process's queue",
                )
                with pytest.raises(RequestsOverloaded) as refused:
                    await service.submit(3)
                assert refused.value.retry_after_s >= 1.0
            assert (await service.submit(4)).tolist() == [8, 8, 8]  # recovered


async def test_a_link_that_ends_fails_the_requests_in_flight(tmp_path: Path) -> None:
    path = str(tmp_path / "engine.sock")
    runner = Doubler(units=100, unit_s=0.01)
    async with hosting(path, runner) as (server, _):
        mine = RequestEngines(["doubler"])
        async with linked(path, mine):
            service = mine.get("doubler")
            assert service is not None

            async def cut() -> None:
                await trio.to_thread.run_sync(runner.started.wait)
                for scope in server.links.values():
                    scope.cancel()  # what an engine restart does to every link

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cut)
                with pytest.raises(EngineUnavailable, match="exited"):  # a 503, not a 500
                    await service.submit(1)
