"""Shutdown with peers that read nothing: everyone is closed in parallel, within the grace."""

from __future__ import annotations

import base64
import json
import os
import socket
from functools import partial

import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from duplex.actors import open_actor_system
from duplex.config import Config, load_config
from duplex.metrics import MetricsRegistry
from duplex.topology import serve_duplex

from .rawws import masked_frame

GRACE_S = 2.0
STALLED = 6


async def _stalled_peer(port: int) -> trio.SocketStream:
    """A Realtime socket whose peer reads nothing while the server has a lot to say."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.send_all(
        (
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:  # frames only after the 101, as RFC 6455 asks
        head += await stream.receive_some(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    update = masked_frame(0x1, json.dumps({"type": "session.update", "session": {}}).encode())
    with trio.move_on_after(1.0):  # each answer is a whole session config: the writer stalls
        for _ in range(4000):
            await stream.send_all(update)
    return stream


async def test_stalled_peers_do_not_delay_the_healthy_ones_or_the_shutdown() -> None:
    """Before: one stop after another, 5 s per stalled socket, and healthy peers saw 1006.
    Then: a stalled peer's session waited on its socket's full queue while the socket's
    reader waited on the session's: now the session lets such a socket go."""
    config = load_config(
        env={},
        overrides={
            "server.port": 0,
            "server.shutdown_grace_s": GRACE_S,
            "server.realtime_vad": "energy",
        },
    )
    stalled: list[trio.SocketStream] = []
    codes: list[int | None] = []
    with trio.fail_after(60):  # the old shutdown hung on the stalled peers' shielded sends
        await _serve_then_stop(config, stalled, codes)


async def _serve_then_stop(
    config: Config, stalled: list[trio.SocketStream], codes: list[int | None]
) -> None:
    registry = MetricsRegistry()
    async with open_actor_system(registry=registry) as system, trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve_duplex, config, system, registry=registry))
        port = int(binds[0].rsplit(":", 1)[1])
        ws_url = f"ws://127.0.0.1:{port}/v1/duplex"

        async def healthy(task_status: trio.TaskStatus[None]) -> None:
            async with connect(ws_url) as ws:
                await ws.send(json.dumps({"type": "session.create"}))
                assert json.loads(await ws.recv())["type"] == "session.created"
                task_status.started()
                try:
                    while True:
                        await ws.recv()
                except ConnectionClosed as closed:
                    codes.append(closed.rcvd.code if closed.rcvd else None)

        for _ in range(3):
            await nursery.start(healthy)
        for _ in range(STALLED):
            stalled.append(await _stalled_peer(port))
        started = trio.current_time()
        system.request_shutdown()
    took = trio.current_time() - started
    assert codes == [1001, 1001, 1001]
    # one grace in all, with room for a slow machine; one stop after another took 5 s each
    assert took < GRACE_S + 2.5, took
    for stream in stalled:  # every stalled connection was ended by the server
        with trio.fail_after(2):
            while True:
                try:
                    if not await stream.receive_some(1 << 16):
                        break
                except trio.BrokenResourceError:
                    break
        await stream.aclose()


_TRITON_SERVER = """
import importlib.util, sys, trio
if importlib.util.find_spec("triton") is None:
    sys.exit(3)
import duplex.kernels.rope  # Triton's extension types, as a GPU model's kernels load them
from tests.transport.wsclient import running_server

async def main():
    async with running_server():
        pass

trio.run(main)
"""


def test_a_server_that_loaded_triton_stops_without_nanobind_leak_lines() -> None:
    """The startup ``gc.freeze`` kept Triton's nanobind objects alive past interpreter
    shutdown, and nanobind printed dozens of ``leaked`` lines at exit; the server
    hands them back to the collector when it stops."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    ran = subprocess.run(
        [sys.executable, "-c", _TRITON_SERVER],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ran.returncode == 3:
        pytest.skip("no Triton in this environment")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "nanobind" not in ran.stderr, ran.stderr[-2000:]
