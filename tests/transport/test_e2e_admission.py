"""Admission end to end: it recovers from slow steps, says why it refuses, and /health,
/metrics and the admission decision read one figure."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest
import trio
from structlog.testing import capture_logs
from websockets.exceptions import ConnectionClosed

from duplex.models import (
    LOOPBACK_SPEC,
    ModelSpec,
    StepOutput,
    StepPlan,
    model_names,
    register_model,
)

from ..helpers import parse_metrics, wait_until
from ..models.models_support import WrappedLoopback
from .wsclient import Server, client, running_server


class SlowFirstStep(WrappedLoopback):
    """Loopback whose first step blocks 0.3 s (a CUDA graph capture, say) and does not say
    so: the served GPU path of the issue, where the first step took 2.06 s."""

    stepped = False

    def execute(self, plan: StepPlan) -> StepOutput:
        if not self.stepped:
            self.stepped = True
            time.sleep(0.3)
        return self.inner.execute(plan)


class SlowPairs(WrappedLoopback):
    """Loopback whose batches of two or more take 0.1 s: over the 64 ms budget."""

    def execute(self, plan: StepPlan) -> StepOutput:
        if len(plan.inputs) >= 2:
            time.sleep(0.1)
        return self.inner.execute(plan)


def _spec(name: str) -> ModelSpec:
    # one phase (a 64 ms budget) and a worker thread for the step, as a GPU model runs
    return dataclasses.replace(
        LOOPBACK_SPEC, name=name, max_slots=16, tick_phases=1, steps_inline=False
    )


SLOW_FIRST = _spec("slow-first-step")
SLOW_PAIRS = _spec("slow-pairs")
for _spec_, _runner in ((SLOW_FIRST, SlowFirstStep), (SLOW_PAIRS, SlowPairs)):
    if _spec_.name not in model_names():
        register_model(_spec_, _runner)


async def _open(server: Server) -> dict:
    async with client(server) as c:
        await c.send({"type": "session.create", "event_id": "create-1"})
        return await c.recv()


async def _figures(server: Server) -> tuple[dict, str]:
    async with httpx.AsyncClient() as http:
        health = (await http.get(server.http + "/health")).json()
        metrics = (await http.get(server.http + "/metrics")).text
    return health, metrics


def _gauge(metrics: str, model: str) -> int:
    value = parse_metrics(metrics).one("duplex_engine_capacity_slots", model=model)
    assert value is not None, metrics
    return int(value)


def _ticks(server: Server) -> float:
    """The engine's ticks so far (its in-process registry)."""
    return parse_metrics(server.registry.render()).sum("duplex_engine_ticks_total")


async def test_a_slow_first_step_does_not_lock_out_later_sessions() -> None:
    """Issue "Admission that recovers": one session, a slow first step, the session ends;
    then eight sessions at once are all admitted (today: capacity 0, all refused 1013)."""
    async with running_server(**{"server.model": SLOW_FIRST.name}) as server:
        async with client(server) as first:
            await first.send({"type": "session.create"})
            await first.until("session.created")
            ticks = _ticks(server)
            await wait_until(  # 25 steps of one slot (2 s of ticks): more than min_samples
                lambda: _ticks(server) >= ticks + 25, timeout_s=30, what="25 engine ticks"
            )
            health, metrics = await _figures(server)
            assert health["sessions"]["capacity"] == 16 == _gauge(metrics, SLOW_FIRST.name)
            await first.send({"type": "session.close"})
            await first.until("session.closed")
        with trio.fail_after(5):
            while (await _figures(server))[0]["sessions"]["live"]:
                await trio.sleep(0.05)
        answers: list[dict] = []

        async def one() -> None:
            answers.append(await _open(server))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        assert [a["type"] for a in answers] == ["session.created"] * 8
        health, metrics = await _figures(server)
        assert health["sessions"]["capacity"] == _gauge(metrics, SLOW_FIRST.name) == 16
        assert "duplex_sessions_refused_total{" not in metrics


async def test_step_time_refusal_is_counted_logged_and_agrees_with_health() -> None:
    overrides = {"server.model": SLOW_PAIRS.name}
    async with running_server(**overrides) as server, client(server) as a, client(server) as b:
        for c in (a, b):
            await c.send({"type": "session.create"})
            await c.until("session.created")
        with trio.fail_after(10):  # 16 steps of two slots, each 0.1 s
            while _gauge((await _figures(server))[1], SLOW_PAIRS.name) != 1:
                await trio.sleep(0.1)
        with capture_logs() as logs:
            async with client(server) as c:
                await c.send({"type": "session.create"})
                error = await c.recv()
                with pytest.raises(ConnectionClosed) as closed:
                    await c.recv()
        health, metrics = await _figures(server)
    assert error["error"]["code"] == "resource_exhausted"
    assert "step time at 2 slots is over budget" in error["error"]["message"]
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    assert health["sessions"] == {"live": 2, "capacity": 1}
    assert _gauge(metrics, SLOW_PAIRS.name) == 1
    assert 'duplex_sessions_refused_total{reason="step_time"} 1' in metrics
    (line,) = [e for e in logs if e["event"] == "session refused"]
    assert line["reason"] == "step_time" and line["over_batch"] == 2
    assert line["over_p99_s"] >= 0.1 and line["budget_s"] == pytest.approx(0.064)


async def test_max_sessions_refusal_has_its_reason() -> None:
    async with running_server(**{"server.max_sessions": 1}) as server, client(server) as a:
        await a.send({"type": "session.create"})
        await a.until("session.created")
        refused = await _open(server)
        health, metrics = await _figures(server)
    assert refused["error"]["code"] == "resource_exhausted"
    assert health["sessions"] == {"live": 1, "capacity": 1}
    assert 'duplex_sessions_refused_total{reason="max_sessions"} 1' in metrics
