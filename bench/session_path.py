"""CPU per frame of a session process's own path: N loopback sessions, no sockets, mock clock.

    .venv/bin/python bench/session_path.py [--sessions 50] [--seconds 20] [--repeats 3]

What one session process does for each frame when its sockets live in connection
workers: a connection actor reads the decoded ``input_audio_buffer.append``, the
session actor and its machine take it (input ledger, VAD, journal), the engine
steps the loopback model on its 80 ms tick, and the echo goes back out through
the session and connection actors. Here the sockets are in-memory queues
(``QueueSocket``, shaped like a worker's ``LinkedSocket`` without the link), and
trio's ``MockClock`` jumps whenever every task waits, so the run takes only the CPU
it needs: the figure is process CPU time over input frames, free of network,
other processes and load-generator noise. The stream is the sessions benchmark's:
20 voiced frames, 5 silent, and again. Use it to compare trees (``PYTHONPATH`` of
another checkout) on one machine; ``bench/sessions.py`` is the end-to-end figure.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np
import trio
import trio.testing

from duplex.actors import open_actor_system
from duplex.config import load_config
from duplex.metrics import MetricsRegistry
from duplex.sessions import AudioAppend, AudioDelta, ServerEvent, SessionCreate, SessionOptions
from duplex.topology._server import open_backend
from duplex.transport._sockets import Received

FRAME = 1920  # 80 ms at 24 kHz
PERIOD_S = 0.08


class QueueSocket:
    """An ``EventSocket`` over memory: the frames to read, and a count of what was sent."""

    def __init__(self) -> None:
        self.feed, self._inbox = trio.open_memory_channel[Received](math.inf)
        self.sent = 0
        self.echoed = 0
        self.closed = False

    @property
    def open(self) -> bool:
        return not self.closed

    @property
    def initial_options(self) -> SessionOptions | None:
        return None

    async def receive(self) -> Received:
        try:
            return await self._inbox.receive()
        except trio.EndOfChannel:
            return None

    async def send(self, event: ServerEvent, seq: int | None) -> None:
        self.sent += 1
        if isinstance(event, AudioDelta):
            self.echoed += 1

    async def close(self, code: int, reason: str) -> None:
        self.closed = True


async def run(sessions: int, seconds: float) -> dict[str, Any]:
    registry = MetricsRegistry()
    config = load_config(
        env={},
        overrides={"session.overlap_policy": "model", "server.realtime_vad": "energy"},
    )
    frames = int(seconds / PERIOD_S)
    voiced = (0.3 * np.sin(2 * np.pi * 440 * np.arange(FRAME) / 24000)).astype(np.float32)
    quiet = np.zeros(FRAME, dtype=np.float32)
    appends = [AudioAppend(voiced if k % 25 < 20 else quiet) for k in range(25)]
    sockets = [QueueSocket() for _ in range(sessions)]
    async with (
        open_actor_system(registry=registry) as system,
        open_backend(config, system, registry) as backend,
        trio.open_nursery() as nursery,
    ):
        await backend.ready.wait()
        for socket in sockets:
            nursery.start_soon(lambda s=socket: backend.connect(s, autostart=False))
            socket.feed.send_nowait(SessionCreate())
        await trio.sleep(1.0)  # every session open, its first ticks idle
        started_cpu, started_wall = time.process_time(), time.perf_counter()

        async def stream(j: int, socket: QueueSocket) -> None:
            await trio.sleep(j * PERIOD_S / sessions)  # spread over the period, as clients are
            start = trio.current_time()
            for k in range(frames):
                await trio.sleep_until(start + k * PERIOD_S)
                socket.feed.send_nowait(appends[k % 25])

        async with trio.open_nursery() as streams:
            for j, socket in enumerate(sockets):
                streams.start_soon(stream, j, socket)
        await trio.sleep(1.0)  # the last echoes
        cpu = time.process_time() - started_cpu
        wall = time.perf_counter() - started_wall
        for socket in sockets:
            socket.feed.close()
        nursery.cancel_scope.cancel()
    echoed = sum(s.echoed for s in sockets)
    expected = sessions * sum(1 for k in range(frames) if k % 25 < 20)
    return {
        "cpu_us_per_frame": 1e6 * cpu / (sessions * frames),
        "wall_s": wall,
        "echoed": echoed,
        "expected": expected,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = []
    for _ in range(args.repeats):
        clock = trio.testing.MockClock(autojump_threshold=0)
        result = trio.run(run, args.sessions, args.seconds, clock=clock)
        results.append(result)
        print(
            f"{args.sessions} sessions x {args.seconds:g} s: "
            f"{result['cpu_us_per_frame']:.0f} us CPU per input frame, "
            f"echoed {result['echoed']} of {result['expected']} voiced frames, "
            f"{result['wall_s']:.1f} s wall"
        )
    median = statistics.median(r["cpu_us_per_frame"] for r in results)
    print(f"median: {median:.0f} us CPU per input frame")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
