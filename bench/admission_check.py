"""Admission that recovers, checked on a served model: a first session, then bursts.

    .venv/bin/python bench/admission_check.py --model tiny --model-device cuda
        [--bursts 8,16] [--first-s 3] [--hold-s 3] [--url http://HOST:PORT]
        [--start-timeout-s 900] [--out FILE.json] [-- EXTRA duplex serve ARGS]

It starts ``duplex serve`` (unless ``--url`` names a running one) with
``session.overlap_policy = model`` and waits for ``/health`` to say ``ok`` (the
GPU path captures every CUDA graph bucket before that). Then:

1. ``first``: one ``/v1/duplex`` session streams silence in real time for
   ``--first-s`` seconds and closes (the issue's lone session whose first step
   was a graph capture);
2. for each N in ``--bursts``: N sessions open at once, each streams a tone in
   real time for ``--hold-s`` seconds, and all close.

After each phase it waits until ``/health`` shows no live session and reads
``/health`` and ``/metrics``. It prints a JSON report (per phase: sessions
admitted and refused with their messages, 80 ms output frames received per
admitted session; after it: ``sessions.capacity`` against the
``duplex_engine_capacity_slots`` gauge, the ``duplex_sessions_refused_total``
samples by reason, warm-up steps and the step p99) and exits 1 unless every
session was admitted and ``/health`` and ``/metrics`` agreed every time.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

FRAME = 1920  # 80 ms at 24 kHz
PERIOD = 0.08


def _frame(k: int, *, speech: bool) -> str:
    if speech:
        n = np.arange(k * FRAME, (k + 1) * FRAME)
        pcm = (0.3 * np.sin(2 * np.pi * 440 * n / 24000) * 32767).astype("<i2").tobytes()
    else:
        pcm = bytes(2 * FRAME)
    audio = base64.b64encode(pcm).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio, "sample_rate": 24000})


async def _session(url: str, seconds: float, *, speech: bool) -> dict[str, Any]:
    """One session: create, stream ``seconds`` in real time, close; what it saw."""
    async with connect(url, max_queue=None) as ws:
        await ws.send(json.dumps({"type": "session.create"}))
        with trio.fail_after(60):
            first = json.loads(await ws.recv())
        if first["type"] != "session.created":
            return {"admitted": False, "error": first.get("error", first)}
        frames = 0
        done = trio.Event()

        async def read() -> None:
            nonlocal frames
            try:
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == "response.audio.delta":
                        frames += len(base64.b64decode(event["delta"])) // (2 * FRAME)
                    elif event["type"] == "session.closed":
                        return
            except ConnectionClosed:
                return
            finally:
                done.set()

        sent = round(seconds / PERIOD)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            start = trio.current_time()
            for k in range(sent):
                await trio.sleep_until(start + k * PERIOD)
                await ws.send(_frame(k, speech=speech))
            await ws.send(json.dumps({"type": "session.close"}))
            with trio.move_on_after(10):
                await done.wait()
            nursery.cancel_scope.cancel()
        return {"admitted": True, "output_frames": frames, "input_frames": sent}


async def _collect(results: list[dict[str, Any]], url: str, seconds: float, speech: bool) -> None:
    results.append(await _session(url, seconds, speech=speech))


async def _state(http: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        health = (await client.get(http + "/health")).json()
        metrics = (await client.get(http + "/metrics")).text

    def samples(name: str) -> dict[str, float]:
        found = re.findall(rf"^{name}(\{{[^}}]*\}})? (\S+)$", metrics, re.M)
        return {labels or "": float(value) for labels, value in found}

    gauge = samples("duplex_engine_capacity_slots")
    return {
        "health_status": health["status"],
        "health_sessions": health["sessions"],
        "capacity_gauge": next(iter(gauge.values()), None),
        "agree": [health["sessions"]["capacity"]] == [int(v) for v in gauge.values()],
        "refused_total": samples("duplex_sessions_refused_total"),
        "warmup_steps_total": samples("duplex_engine_warmup_steps_total"),
        "step_p99_seconds": samples("duplex_engine_step_p99_seconds"),
        "late_ticks_total": samples("duplex_engine_late_ticks_total"),
    }


async def _wait_idle(http: str) -> None:
    with trio.fail_after(60):
        while (await _state(http))["health_sessions"]["live"]:
            await trio.sleep(0.1)


async def _wait_ready(http: str, timeout_s: float, server: subprocess.Popen | None) -> float:
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() - start < timeout_s:
            if server is not None and server.poll() is not None:
                raise SystemExit(f"duplex serve exited with {server.returncode}")
            try:
                if (await client.get(http + "/health")).status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            await trio.sleep(0.5)
    raise SystemExit(f"/health not ok after {timeout_s} s")


async def check(args: argparse.Namespace, http: str, server: subprocess.Popen | None) -> bool:
    ready_s = await _wait_ready(http, args.start_timeout_s, server)
    report: dict[str, Any] = {"ready_after_s": round(ready_s, 1)}
    report["idle"] = await _state(http)
    url = http.replace("http://", "ws://") + "/v1/duplex"
    phases: list[tuple[str, int, float, bool]] = [("first", 1, args.first_s, False)]
    phases += [(f"burst-{n}", n, args.hold_s, True) for n in args.bursts]
    ok = report["idle"]["agree"]
    for name, count, seconds, speech in phases:
        results: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(_collect, results, url, seconds, speech)
        await _wait_idle(http)
        admitted = [r for r in results if r["admitted"]]
        state = await _state(http)
        report[name] = {
            "sessions": count,
            "admitted": len(admitted),
            "refused": [r["error"] for r in results if not r["admitted"]],
            "output_frames_per_session": sorted(r["output_frames"] for r in admitted),
            "input_frames_per_session": round(seconds / PERIOD),
            "after": state,
        }
        ok = ok and len(admitted) == count and state["agree"]
        print(f"{name}: {len(admitted)}/{count} admitted, agree={state['agree']}", file=sys.stderr)
    report["passed"] = ok
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return ok


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-device", default="cpu")
    parser.add_argument("--bursts", default="8,16", help="comma-separated session counts")
    parser.add_argument("--first-s", type=float, default=3.0)
    parser.add_argument("--hold-s", type=float, default=3.0)
    parser.add_argument("--url", help="a running server (http://HOST:PORT); else one is started")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("serve_args", nargs="*", help="after --: more duplex serve arguments")
    args = parser.parse_args()
    args.bursts = [int(n) for n in args.bursts.split(",") if n]
    if args.url:
        return 0 if trio.run(check, args, args.url.rstrip("/"), None) else 1
    port = _free_port()
    argv = [sys.executable, "-m", "duplex.cli", "serve", "--port", str(port)]
    argv += ["--model", args.model, "--model-device", args.model_device, *args.serve_args]
    env = {**os.environ, "DUPLEX_SESSION__OVERLAP_POLICY": "model"}
    print("starting:", " ".join(argv[2:]), file=sys.stderr)
    server = subprocess.Popen(argv, env=env)
    try:
        ok = trio.run(check, args, f"http://127.0.0.1:{port}", server)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
