"""Lifecycle logs over a real socket: what an operator reads of one session's life, in order.

Each test captures structlog's events (``capture_logs``) while a client drives a
session through ``running_server``, then reads them as an operator would: by
event name, in order, joined by ``session_id`` and ``connection``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog
import trio
from structlog.testing import capture_logs
from websockets.trio.client import connect

from duplex.transport._connection import BAD_EVENTS_LOGGED

from .wsclient import Client, Server, client, running_server

LIFECYCLE = {
    "connection opened",
    "connection closed",
    "session created",
    "session resumed",
    "session replaced",
    "session expired",
    "session closed",
    "bad event",
}
KEY = "sk-duplex-" + "s" * 24


async def open_session(c: Client) -> dict[str, Any]:
    await c.send({"type": "session.create", "event_id": "create-1"})
    created = await c.recv()
    assert created["type"] == "session.created"
    return created


async def use_session(c: Client) -> None:
    """One client event: the session then waits out its grace when the socket drops."""
    await c.send({"type": "session.update", "event_id": "use-1", "session": {}})
    await c.until("session.updated")


def resume(created: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "session.resume",
        "session_id": created["session"]["id"],
        "resume_token": created["resume_token"],
        "last_received_server_event_seq": 0,
    }


def lifecycle(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] in LIFECYCLE]


async def wait_for(logs: list[dict[str, Any]], event: str, count: int = 1) -> None:
    """Lines are written when actors stop, a little after the client saw the close."""
    with trio.fail_after(10):
        while sum(line["event"] == event for line in logs) < count:
            await trio.sleep(0.01)


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "two-workers"])
async def test_one_session_whole_life_in_order(workers: int) -> None:
    with capture_logs() as logs:
        async with running_server(**{"server.connection_workers": workers}) as server:
            async with client(server) as c:
                created = await open_session(c)
                await c.send({"type": "no.such.event", "event_id": "bad-1", "audio": "QUJD"})
                error = await c.until("error")
                assert error["error"]["code"] == "unknown_event"
                await c.send({"type": "session.close", "event_id": "close-1"})
                await c.until("session.closed")
            await wait_for(logs, "connection closed")
    session_id = created["session"]["id"]
    lines = lifecycle(logs)
    assert [line["event"] for line in lines] == [
        "connection opened",
        "session created",
        "bad event",
        "session closed",
        "connection closed",
    ]
    opened, made, bad, closed, gone = lines
    assert opened["endpoint"] == "/v1/duplex"  # a worker's socket's too, over its link
    assert opened["peer"] == "127.0.0.1"
    assert opened["log_level"] == made["log_level"] == closed["log_level"] == "info"
    connection = opened["connection"]
    assert made["connection"] == bad["connection"] == gone["connection"] == connection
    assert closed["connection"] == connection
    assert made["session_id"] == bad["session_id"] == closed["session_id"] == session_id
    assert gone["session_id"] == session_id
    assert bad["log_level"] == "warning"
    assert (bad["code"], bad["event_type"]) == ("unknown_event", "no.such.event")
    assert "QUJD" not in repr(bad)  # the frame's fields are never logged
    assert closed["reason"] == "client_close"
    assert (gone["code"], gone["reason"], gone["by"]) == (1000, "client_close", "server")
    assert gone["bad_events"] == 1


async def test_bad_events_are_logged_a_few_then_counted() -> None:
    with capture_logs() as logs:
        async with running_server() as server:
            async with client(server) as c:
                for i in range(BAD_EVENTS_LOGGED + 4):
                    await c.send("{not json" if i % 2 else {"type": "nope", "event_id": f"b{i}"})
                    await c.until("error")
            await wait_for(logs, "connection closed")
    bad = [line for line in logs if line["event"] == "bad event"]
    assert len(bad) == BAD_EVENTS_LOGGED
    assert [line["code"] for line in bad] == ["unknown_event", "invalid_json", "unknown_event"]
    assert bad[-1]["last_logged"] is True
    (gone,) = [line for line in logs if line["event"] == "connection closed"]
    assert gone["bad_events"] == BAD_EVENTS_LOGGED + 4
    # the client closed its socket; hypercorn reports any client close as 1006
    assert gone["by"] == "client" and gone["code"] in (1000, 1006)


async def test_resume_and_replace_are_logged_without_secrets() -> None:
    """A resume token and an API key go over the wire, and never into the log."""
    bearer = {"Authorization": f"Bearer {KEY}"}
    with capture_logs() as logs:
        async with running_server(**{"server.api_keys": [KEY]}) as server:
            async with connect(server.url, additional_headers=bearer, max_queue=None) as ws:
                first = Client(ws)
                created = await open_session(first)
                await use_session(first)
                async with connect(server.url, additional_headers=bearer, max_queue=None) as ws2:
                    second = Client(ws2)
                    await second.send(resume(created))
                    resumed = await second.until("session.resumed")
                    await first.until("session.replaced")
                    await second.send({"type": "session.close"})
                    await second.until("session.closed")
            await wait_for(logs, "connection closed", 2)
    session_id = created["session"]["id"]
    lines = lifecycle(logs)
    events = [line["event"] for line in lines]
    assert events.index("session created") < events.index("session resumed")
    assert events.index("session resumed") > events.index("session replaced")  # old one first
    (made,) = [line for line in lines if line["event"] == "session created"]
    (back,) = [line for line in lines if line["event"] == "session resumed"]
    (replaced,) = [line for line in lines if line["event"] == "session replaced"]
    assert made["session_id"] == back["session_id"] == replaced["session_id"] == session_id
    assert replaced["connection"] == made["connection"] and replaced["by"] == back["connection"]
    closes = {line["connection"]: line for line in lines if line["event"] == "connection closed"}
    old = closes[made["connection"]]
    assert (old["code"], old["reason"]) == (4001, "session_replaced")
    text = json.dumps(logs, default=repr)
    for secret in (KEY, created["resume_token"], resumed["resume_token"]):
        assert secret not in text


async def test_expiry_is_logged_with_its_reason() -> None:
    with capture_logs() as logs:
        async with running_server(**{"session.disconnect_grace_s": 0.2}) as server:
            created = await _open_used_and_drop(server)
            await wait_for(logs, "session closed")
    lines = [line for line in lifecycle(logs) if line.get("session_id") == created]
    events = [line["event"] for line in lines]
    assert events[-2:] == ["session expired", "session closed"]
    assert lines[-2]["reason"] == lines[-1]["reason"] == "disconnect_grace_expired"
    assert lines[-1]["connection"] is None  # it had no socket when it expired


async def test_a_refusal_closes_with_a_warning() -> None:
    with capture_logs() as logs:
        async with running_server() as server:
            async with client(server) as c:
                await c.send(resume({"session": {"id": "duplex-nope"}, "resume_token": "x" * 8}))
                error = await c.until("error")
                assert error["error"]["code"] == "session_resume_expired"
            await wait_for(logs, "connection closed")
    (gone,) = [line for line in logs if line["event"] == "connection closed"]
    assert gone["log_level"] == "warning" and gone["session_id"] == "duplex-nope"
    assert (gone["code"], gone["reason"], gone["by"]) == (1008, "session_resume_expired", "server")
    assert "x" * 8 not in json.dumps(logs, default=repr)


async def test_client_chosen_strings_are_cut_in_the_log() -> None:
    long_id = "duplex-" + "z" * 5000
    with capture_logs() as logs:
        async with running_server() as server:
            async with client(server) as c:
                await c.send({"type": "t" * 5000})
                await c.until("error")
                await c.send(resume({"session": {"id": long_id}, "resume_token": "x" * 8}))
                await c.until("error")
            await wait_for(logs, "connection closed")
    (bad,) = [line for line in logs if line["event"] == "bad event"]
    (gone,) = [line for line in logs if line["event"] == "connection closed"]
    assert bad["event_type"] == "t" * 64 and gone["session_id"] == long_id[:64]


@contextmanager
def _debug_level() -> Iterator[None]:
    """Debug lines pass, whatever level an earlier test configured (a process-wide filter)."""
    wrapper = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(wrapper_class=wrapper)


async def test_an_event_the_session_refuses_is_a_debug_line() -> None:
    ack = {"type": "session.event_ack", "event_id": "a1", "server_event_seq": 99}
    with _debug_level(), capture_logs() as logs:
        async with running_server() as server, client(server) as c:
            created = await open_session(c)
            await c.send(ack)
            error = await c.until("error")
    (line,) = [line for line in logs if line["event"] == "event refused"]
    assert line["log_level"] == "debug" and line["code"] == error["error"]["code"]
    assert line["session_id"] == created["session"]["id"]


async def _open_used_and_drop(server: Server) -> str:
    async with client(server) as c:
        created = await open_session(c)
        await use_session(c)
    return created["session"]["id"]


async def test_a_bad_realtime_query_is_refused_with_a_warning() -> None:
    with capture_logs() as logs:
        async with running_server() as server:
            url = server.url.replace("/v1/duplex", "/v1/realtime?duplex=maybe")
            async with connect(url, max_queue=None) as ws:
                error = await Client(ws).recv()
    assert (error["error"]["code"], error["error"]["param"]) == ("bad_event", "duplex")
    (line,) = [line for line in logs if line["event"] == "connection refused"]
    assert line["log_level"] == "warning" and line["reason"] == "bad_query"
    assert (line["code"], line["peer"], line["endpoint"]) == (1008, "127.0.0.1", "/v1/realtime")
    assert line["param"] == "duplex"
