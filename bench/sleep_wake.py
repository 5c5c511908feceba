"""Sleep and wake of a served engine: memory before, asleep and awake, and the time each takes.

Starts ``duplex serve`` (a real subprocess on a loopback port) with the model asked for,
then ``rounds`` times: ``POST /v1/omni/sleep``, ``POST /v1/omni/wakeup``, and one
``/v1/duplex`` session that must open and echo after each wake. The server's own answers
give the resident memory (and on CUDA the allocated and reserved device memory); the
bench adds the process's RSS read from ``/proc`` and the wall time of each call.

    python bench/sleep_wake.py --model tiny --rounds 3
    python bench/sleep_wake.py --model moshi-7b --random-weights --model-device cuda \\
        --engine-process on    # the GPU default: the engine processes stop asleep
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import client, commit, machine, rss_bytes, serve, write_report

RESULTS = Path(__file__).resolve().parent / "results"


async def one_session(url: str) -> None:
    """A session opens after the wake (the engine admits again)."""
    async with client(url) as c:
        await c.send({"type": "session.create", "event_id": "bench"})
        created = await c.until("session.created", timeout=60)
        assert created is not None and created["type"] == "session.created"


async def main(args: argparse.Namespace) -> dict[str, Any]:
    flags = ["--model", args.model, "--engine-process", args.engine_process, "--no-agent",
             "--model-device", args.model_device, "--tts", "none"]  # fmt: skip
    if args.random_weights:
        flags.append("--random-weights")
    rounds: list[dict[str, Any]] = []
    log = RESULTS / "sleep_wake.log"
    async with serve(flags, log=log, ready_timeout_s=600) as served:
        pid = served.process.pid
        async with httpx.AsyncClient(base_url=served.http, timeout=600) as http:
            await one_session(served.ws("/v1/duplex"))
            for _ in range(args.rounds):
                before = rss_bytes(pid)
                started = time.monotonic()
                slept = (await http.post("/v1/omni/sleep")).json()
                sleep_s = time.monotonic() - started
                asleep = rss_bytes(pid)
                started = time.monotonic()
                woke = (await http.post("/v1/omni/wakeup")).json()
                wake_s = time.monotonic() - started
                awake = rss_bytes(pid)
                await one_session(served.ws("/v1/duplex"))
                rounds.append({
                    "rss_before": before, "rss_asleep": asleep, "rss_awake": awake,
                    "sleep_call_s": round(sleep_s, 3), "wake_call_s": round(wake_s, 3),
                    "server_sleep": slept, "server_wake": woke,
                })  # fmt: skip
    mib = 1024 * 1024
    summary = {
        "rss_before_mib": statistics.median(r["rss_before"] for r in rounds) / mib,
        "rss_asleep_mib": statistics.median(r["rss_asleep"] for r in rounds) / mib,
        "rss_awake_mib": statistics.median(r["rss_awake"] for r in rounds) / mib,
        "sleep_s_median": statistics.median(r["sleep_call_s"] for r in rounds),
        "wake_s_median": statistics.median(r["wake_call_s"] for r in rounds),
        "engine_released": all(r["server_sleep"].get("engine_released") for r in rounds),
    }
    if "engine_processes" in rounds[0]["server_sleep"].get("memory_before", {}):
        # engine processes: a sleep stops them; the server's answers carry their memory
        for key, answer, field in (
            ("engine_rss_before_mib", "server_sleep", "memory_before"),
            ("engine_rss_asleep_mib", "server_sleep", "memory_asleep"),
            ("engine_rss_awake_mib", "server_wake", "memory_awake"),
        ):
            summary[key] = statistics.median(r[answer][field]["rss_bytes"] for r in rounds) / mib
    return {
        "machine": machine(),
        "commit": commit(),
        "command": "python bench/sleep_wake.py " + " ".join(args.argv),
        "summary": {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()},
        "rounds": rounds,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-device", default="cpu")
    parser.add_argument("--engine-process", default="off")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="the report (default results/sleep_wake.json)")
    parsed, _ = parser.parse_known_args()
    parsed.argv = sys.argv[1:]
    report = trio.run(main, parsed)
    write_report(parsed.out or RESULTS / "sleep_wake.json", report)
    print(json.dumps(report["summary"], indent=2))
