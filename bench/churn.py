"""Server memory and live sessions' output gaps while sessions are opened and closed in a loop.

    .venv/bin/python bench/churn.py [--cycles 10000] [--every 1000] [--live 3]
        [--baseline-s 10] [--trace] [--src DIR] [--out bench/results/churn-NAME]

Starts ``duplex serve`` (model ``loopback``, every speaking frame echoed) on a free
port as a subprocess, then, from this process (trio + the ``websockets`` client):

- ``--live`` streaming sessions on ``/v1/duplex``: each sends one 80 ms frame of a
  440 Hz tone every 80 ms on an absolute schedule, so the loopback answers every
  frame, and records when each ``response.audio.delta`` arrives. The *output gap*
  is the time between two consecutive deltas of one session: 80 ms when nothing
  stalls the server;
- one churn loop, on its own sockets, one after the other: connect,
  ``session.create``, wait for ``session.created``, ``session.close``, wait for
  the close. Nothing else happens in those sessions.

First ``--baseline-s`` seconds of the live sessions alone, then the cycles. After
every ``--every`` cycles it prints the server's RSS (``VmRSS`` of the process),
the cycles per second, and the live sessions' gap p50 / p99 / max over that
window. ``--trace`` runs the server under ``bench/_duplex_trace.py``, which at
each report writes what the process holds (``tracemalloc`` top growth and the
objects the collector tracks, by type) to ``<out>.trace.txt``: how the leak of
a closed session was found (docs/reliability.md). ``--src DIR`` serves the
``duplex`` package in DIR (``git archive REV duplex | tar -x -C DIR``) instead of
the working tree's: a before/after comparison.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio
from websockets.trio.client import connect

ROOT = Path(__file__).resolve().parent.parent
FRAME = 1920  # 80 ms at 24 kHz
PERIOD = 0.08


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    """The process's resident set (``VmRSS``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tone_frame() -> str:
    n = np.arange(FRAME)
    pcm = (0.3 * np.sin(2 * np.pi * 440 * n / 24000) * 32767).astype("<i2").tobytes()
    audio = base64.b64encode(pcm).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio, "sample_rate": 24000})


@dataclass
class Gaps:
    """Receipt times of each live session's audio deltas; gaps read per window."""

    last: dict[int, float] = field(default_factory=dict)
    window: list[float] = field(default_factory=list)

    def delta(self, session: int, now: float) -> None:
        previous = self.last.get(session)
        if previous is not None:
            self.window.append(now - previous)
        self.last[session] = now

    def take(self) -> dict[str, float]:
        gaps, self.window = np.array(self.window) * 1000, []
        if not len(gaps):
            return {"gaps": 0}
        return {
            "gaps": len(gaps),
            "gap_p50_ms": round(float(np.percentile(gaps, 50)), 1),
            "gap_p99_ms": round(float(np.percentile(gaps, 99)), 1),
            "gap_max_ms": round(float(gaps.max()), 1),
        }


async def live_session(url: str, index: int, gaps: Gaps, ready: trio.Event) -> None:
    frame = tone_frame()
    async with connect(url, max_queue=None) as ws:
        await ws.send(json.dumps({"type": "session.create"}))
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created

        async def send() -> None:
            start = trio.current_time()
            k = 0
            while True:
                await trio.sleep_until(start + k * PERIOD)
                await ws.send(frame)
                k += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            ready.set()
            async for message in ws:
                if '"response.audio.delta"' in message[:80]:
                    gaps.delta(index, trio.current_time())


async def one_cycle(url: str) -> bool:
    """One session opened and closed; ``False``: refused (``resource_exhausted``)."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "session.create"}))
        created = json.loads(await ws.recv())
        if created["type"] == "error" and created["error"]["code"] == "resource_exhausted":
            return False
        assert created["type"] == "session.created", created
        await ws.send(json.dumps({"type": "session.close"}))
        with contextlib.suppress(Exception):
            async for _ in ws:  # session.closed, then the server's close (1000)
                pass
    return True


async def run(args: argparse.Namespace, pid: int, url: str, trace: Path | None) -> dict[str, Any]:
    gaps = Gaps()
    rows: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        for i in range(args.live):
            ready = trio.Event()
            nursery.start_soon(live_session, url, i, gaps, ready)
            await ready.wait()
        await trio.sleep(2.0)  # warm: the first deltas
        gaps.take()
        await trio.sleep(args.baseline_s)
        base = {"cycles": 0, "rss_mb": round(rss_mb(pid), 1), "cycles_per_s": None, **gaps.take()}
        rows.append(base)
        print(json.dumps(base), flush=True)
        if trace is not None:
            os.kill(pid, signal.SIGUSR1)
        started = time.monotonic()
        refused = 0
        for cycle in range(1, args.cycles + 1):
            while not await one_cycle(url):  # admission said no (a slow step): try again
                refused += 1
                await trio.sleep(0.1)
            if cycle % args.every == 0:
                elapsed = time.monotonic() - started
                await trio.sleep(1.0)  # let the last closes finish before reading RSS
                row = {
                    "cycles": cycle,
                    "rss_mb": round(rss_mb(pid), 1),
                    "cycles_per_s": round(args.every / elapsed, 1),
                    "refused": refused,
                    **gaps.take(),
                }
                refused = 0
                rows.append(row)
                print(json.dumps(row), flush=True)
                if trace is not None:
                    os.kill(pid, signal.SIGUSR1)
                started = time.monotonic()
        nursery.cancel_scope.cancel()
    return {"rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--live", type=int, default=3)
    parser.add_argument("--baseline-s", type=float, default=10.0)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--src", type=Path, default=ROOT, help="serve the duplex package here")
    parser.add_argument("--out", type=Path, default=None, help="write <out>.json (and logs)")
    args = parser.parse_args()
    port = free_port()
    env = {
        **os.environ,
        "DUPLEX_SESSION__OVERLAP_POLICY": "model",
        "DUPLEX_LOG_LEVEL": "warning",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(args.src.resolve()), os.environ.get("PYTHONPATH")])
        ),
    }
    trace = None
    argv = [sys.executable, "-m", "duplex.cli"]
    if args.trace:
        trace = (args.out or Path("churn")).with_suffix(".trace.txt")
        env["CHURN_TRACE_OUT"] = str(trace.resolve())
        argv = [sys.executable, str(ROOT / "bench" / "_duplex_trace.py")]
    argv += ["serve", "--port", str(port)]
    log = (args.out or Path("churn")).with_suffix(".server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=args.src, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; see {log}")
            health = f"http://127.0.0.1:{port}/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=1) as r:
                if json.loads(r.read())["status"] == "ok":
                    break
            time.sleep(0.2)
        url = f"ws://127.0.0.1:{port}/v1/duplex"
        result = trio.run(run, args, proc.pid, url, trace)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    # folder names only: result files carry no machine's paths
    argv = [Path(a).name if os.path.isabs(a) else a for a in sys.argv[1:]]
    result["command"] = " ".join(["bench/churn.py", *argv])
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
