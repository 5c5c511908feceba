"""``duplex serve`` exits by ``shutdown_grace_s + 1`` whatever it holds (issue 35): SIGTERM
with healthy and non-reading peers took 30-56 s with a 5 s grace (one actor's stop
timeout after another). The healthy peers still get 1001 at once.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from .test_e2e_bounded_media import serving
from .test_e2e_shutdown import _stalled_peer

GRACE_S = 2.0
CONFIG = f"""
[server]
agent = false
realtime_vad = "energy"
shutdown_grace_s = {GRACE_S}
"""


async def test_sigterm_with_non_reading_peers_exits_within_the_grace(tmp_path: Path) -> None:
    async with serving(tmp_path, CONFIG, stop=False) as (url, process, lines):
        port = int(url.rsplit(":", 1)[1])
        codes: list[int | None] = []
        stalled = []
        async with trio.open_nursery() as nursery:

            async def healthy(task_status: trio.TaskStatus[None]) -> None:
                async with connect(f"ws://127.0.0.1:{port}/v1/duplex") as ws:
                    await ws.send(json.dumps({"type": "session.create"}))
                    assert json.loads(await ws.recv())["type"] == "session.created"
                    task_status.started()
                    try:
                        while True:
                            await ws.recv()
                    except ConnectionClosed as closed:
                        codes.append(closed.rcvd.code if closed.rcvd else None)

            for _ in range(5):
                await nursery.start(healthy)
            for _ in range(5):
                stalled.append(await _stalled_peer(port))
            process.send_signal(signal.SIGTERM)
            signalled = trio.current_time()
            with trio.move_on_after(60):
                await process.wait()
            took = trio.current_time() - signalled
            assert process.returncode is not None, "\n".join(lines[-10:])
        for stream in stalled:
            await stream.aclose()
        assert codes == [1001] * 5
        # the grace and its one second, with room for a loaded 2-core host's scheduling
        assert took < GRACE_S + 1 + 1.0, (took, lines[-5:])
