"""Faults end to end: the engine dies mid-session; sessions are told and carry on."""

from __future__ import annotations

import dataclasses
import threading

import httpx
import trio
from structlog.testing import capture_logs

from duplex.models import (
    LOOPBACK_SPEC,
    StepOutput,
    StepPlan,
    model_names,
    register_model,
)

from ..models.models_support import WrappedLoopback
from .wsclient import client, running_server, silence, tone

FAULT = threading.Event()
"""Set it and the next engine step raises (once), as a crashing model would."""


class FaultyRunner(WrappedLoopback):
    """The loopback runner, except that a step raises once ``FAULT`` is set."""

    def execute(self, plan: StepPlan) -> StepOutput:
        if FAULT.is_set():
            FAULT.clear()
            raise RuntimeError("injected engine fault")
        return self.inner.execute(plan)


FAULTY_SPEC = dataclasses.replace(LOOPBACK_SPEC, name="faulty-loopback")
if FAULTY_SPEC.name not in model_names():
    register_model(FAULTY_SPEC, FaultyRunner)


async def test_engine_crash_mid_response_restarts_engine_and_sessions_continue() -> None:
    overrides = {"server.model": FAULTY_SPEC.name, "session.overlap_policy": "model"}
    async with running_server(**overrides) as server, client(server) as c:
        await c.send({"type": "session.create"})
        await c.until("session.created")
        await c.stream(tone(30), realtime=False)  # a long answer: the fault lands inside it
        await c.until("response.audio.delta")
        with capture_logs() as logs:
            FAULT.set()
            error = await c.until("error")
        assert error["error"]["code"] == "engine_error"
        # the open response ends first, as failed, then the error explains why
        kinds = [e["type"] for e in c.events]
        done = c.of("response.done")[-1]
        assert done["response"]["status"] == "failed"
        assert kinds.index("response.done") < len(kinds) - 1
        # the session lives on, on a fresh engine: speak again, get an answer
        c.events.clear()
        await c.stream(tone(6) + silence(6), realtime=False)
        done = await c.until("response.done")
        assert done["response"]["status"] == "completed"
        assert c.of("response.audio.delta")
        async with httpx.AsyncClient() as http:
            health = (await http.get(server.http + "/health")).json()
        assert health["engine_starts"] == 2 and health["sessions"]["live"] == 1
    assert not FAULT.is_set()
    (restarted,) = [line for line in logs if line["event"] == "engine restarted"]
    assert restarted["log_level"] == "info" and restarted["sessions"] == 1
    assert restarted["restarts"] == 1 and restarted["model"] == FAULTY_SPEC.name


async def test_health_reports_the_engine() -> None:
    async with running_server() as server, httpx.AsyncClient() as http:
        response = await http.get(server.http + "/health")
        assert response.status_code == 200
        assert response.json()["engine_starts"] == 1
        await trio.sleep(0)
