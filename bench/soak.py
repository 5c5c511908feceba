"""Soak: many sessions on ``duplex serve`` for a long time; are its resources flat?

    .venv/bin/python bench/soak.py [--minutes 30 | --seconds S] [--sessions 24]
        [--sample-s 10] [--warmup-s 60] [--out bench/results/soak] [-- duplex serve ARGS]

Starts ``duplex serve`` (through ``bench/_probe_serve.py``, which adds the server's trio
task count and GC-tracked objects to what ``/proc`` shows) with the loopback model and
runs ``--sessions`` clients on ``/v1/duplex`` for the whole time. Each client streams
80 ms PCM16 frames on a real-time schedule (12 frames of tone, 13 of silence: one echoed
response every 2 s) and, after 3 to 12 responses, ends its session and opens the next:
half the time with ``session.close``, otherwise by dropping the socket and resuming
with ``session.resume`` on a new one (and closing that session after 1 to 3 more
responses). So sessions come and go while the number live stays near ``--sessions``.

Samples, every ``--sample-s``: for every process of the server's tree (server, workers,
shards, engine processes) its RSS, open fds and threads; the server process's trio tasks
and GC-tracked objects (all of them, garbage not yet collected included, and the *floor*:
those that survived the collector's latest full collection); ``/health``'s live sessions.
At each idle point the probe also runs a full collection and counts the **live** objects.
Before the measured run the load runs ``--warmup-s``, stops, and everything settles (no
session live, no slot held): the **idle baseline**. After it, the load stops and
everything settles again: the **idle end**. Flat means the idle end matches the baseline
(the same tasks and fds, RSS and live objects within noise) and the under-load series
(RSS, the objects' floor) have no trend: the report gives each series' least-squares
slope per 10 minutes over the measured run.

Writes ``OUT.json`` and ``OUT.png`` (RSS, fds, tasks, GC objects and live sessions over
time). Exit code 0; the verdict is for the reader (docs/reliability.md), and
``tests/transport/test_e2e_soak.py`` asserts it loosely on a short run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import (
    PERIOD,
    Client,
    client,
    commit,
    get_json,
    log_problems,
    machine,
    metric_sum,
    metrics,
    open_fds,
    process_name,
    rss_bytes,
    serve,
    settle,
    silence,
    threads,
    tone,
    tree,
    write_report,
)

IDLE_DELTAS = ("rss_mb_total", "fds_total", "tasks", "gc_objects", "gc_live", "malloc_in_use",
               "malloc_free", "pymalloc_blocks")  # fmt: skip
LOUD = [tone(1, start=k) for k in range(12)]
QUIET = silence(1)
CYCLE = 25  # frames: 12 loud, 13 quiet


class Load:
    """The clients, and what they saw."""

    def __init__(self, url: str, sessions: int, seed: int) -> None:
        self.url = url
        self.sessions = sessions
        self.random = random.Random(seed)
        self.stop = trio.Event()
        self.counts = {
            "sessions_opened": 0,
            "closed": 0,
            "resumed": 0,
            "resume_failed": 0,
            "responses": 0,
            "errors": 0,
            "refused": 0,
            "unexpected_close": 0,
            "connect_failed": 0,
        }
        self.error_codes: dict[str, int] = {}

    async def run(self, for_s: float) -> None:
        self.stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for index in range(self.sessions):
                nursery.start_soon(self._client, index * PERIOD / self.sessions)
            await trio.sleep(for_s)
            self.stop.set()

    async def _talk(self, c: Client, responses: int) -> int | None:
        """Stream until ``responses`` responses are done (or the load stops); returns the
        last journaled seq seen, or ``None`` if the socket closed."""
        target = len(c.of("response.done")) + responses
        failed = False

        async def read() -> None:
            nonlocal failed
            while len(c.of("response.done")) < target:
                event = await c.recv(30)
                if event is None:
                    failed = True
                    return
                if event["type"] == "error":
                    code = event["error"]["code"]
                    self.error_codes[code] = self.error_codes.get(code, 0) + 1
                    self.counts["errors"] += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            start = trio.current_time()
            k = 0
            while not failed and len(c.of("response.done")) < target and not self.stop.is_set():
                await trio.sleep_until(start + k * PERIOD)
                frame = LOUD[k % CYCLE] if k % CYCLE < 12 else QUIET
                if not await c.stream(frame):
                    break
                k += 1
            nursery.cancel_scope.cancel()
        self.counts["responses"] += len(c.of("response.done"))
        if c.closed:
            return None
        return max((e.get("server_event_seq") or 0 for e in c.events), default=0)

    async def _client(self, offset: float) -> None:
        await trio.sleep(offset)
        while not self.stop.is_set():
            try:
                with trio.fail_after(120):
                    await self._one_session()
            except (trio.TooSlowError, ConnectionClosed):
                self.counts["unexpected_close"] += 1
            except (OSError, InvalidHandshake, InvalidMessage, EOFError):
                self.counts["connect_failed"] += 1  # a saturated machine: try again
                await trio.sleep(1)

    async def _one_session(self) -> None:
        async with client(self.url) as c:
            await c.send({"type": "session.create", "session": {}})
            created = await c.recv(30)
            if created is None or created["type"] != "session.created":
                self.counts["refused"] += 1  # the machine is full (admission): later
                await trio.sleep(2)
                return
            self.counts["sessions_opened"] += 1
            cursor = await self._talk(c, self.random.randint(3, 12))
            if cursor is None:
                self.counts["unexpected_close"] += 1
                return
            if self.stop.is_set() or self.random.random() < 0.5:
                await c.send({"type": "session.close"})
                await c.until("session.closed", 10)
                self.counts["closed"] += 1
                return
            await c.ws.aclose()  # dropped: the session waits for a resume
        async with client(self.url) as c:
            await c.send(
                {
                    "type": "session.resume",
                    "session_id": created["session"]["id"],
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": cursor,
                }
            )
            resumed = await c.recv(30)
            if resumed is None or resumed["type"] != "session.resumed":
                self.counts["resume_failed"] += 1
                return
            self.counts["resumed"] += 1
            await self._talk(c, self.random.randint(1, 3))
            await c.send({"type": "session.close"})
            await c.until("session.closed", 10)
            self.counts["closed"] += 1


def _probe_last(path: Path) -> dict[str, Any]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return json.loads(lines[-1]) if lines else {}


async def sample(served: Any, probe: Path, t0: float, phase: str) -> dict[str, Any]:
    processes = {}
    for pid in tree(served.pid):
        name = process_name(pid, served.pid)
        if name not in ("server", "worker", "shard", "engine"):
            continue
        processes[f"{name}-{pid}"] = {
            "rss_mb": round((rss_bytes(pid) or 0) / 2**20, 1),
            "fds": open_fds(pid),
            "threads": threads(pid),
        }
    _, health = await get_json(served.http, "/health")
    text = await metrics(served.http)
    last = _probe_last(probe)
    return {
        "t_s": round(time.monotonic() - t0, 1),
        "phase": phase,
        "processes": processes,
        "rss_mb_total": round(sum(p["rss_mb"] for p in processes.values()), 1),
        "fds_total": sum(p["fds"] or 0 for p in processes.values()),
        "tasks": last.get("tasks"),
        "gc_objects": last.get("gc_objects"),
        "gc_floor": last.get("gc_floor"),
        "gc_full": last.get("gc_full"),
        "gc_live": last.get("gc_live"),  # only where asked for (the idle points)
        **{  # the allocator's view (bench/_probe_serve.py), in MB
            key: round(last[key] / 2**20, 2)
            for key in ("malloc_in_use", "malloc_free", "malloc_mmap")
            if last.get(key) is not None
        },
        "pymalloc_blocks": last.get("pymalloc_blocks"),
        "sessions_live": health["sessions"]["live"],
        "engine_live_slots": metric_sum(text, "duplex_engine_live_slots"),
        "late_ticks": metric_sum(text, "duplex_engine_late_ticks_total"),
    }


def slope_per_10min(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    return round(float(np.polyfit(np.array(xs), np.array(ys, dtype=float), 1)[0]) * 600, 2)


async def wait_probe(
    probe: Path, after: float, timeout_s: float = 30, *, key: str | None = None
) -> None:
    """Until the probe has written a sample taken after ``after`` (monotonic), with ``key``
    if given."""
    with trio.fail_after(timeout_s):
        while True:
            last = _probe_last(probe)
            if last.get("t", 0) > after and (key is None or key in last):
                return
            await trio.sleep(0.1)


def malloc_trims(text: str) -> dict[str, Any]:
    """``duplex_malloc_trim_seconds`` per process label set of a ``/metrics`` scrape: how
    many trims, their mean, and the cumulative count at each bucket bound (seconds)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith("duplex_malloc_trim_seconds"):
            continue
        name, _, value = line.rpartition(" ")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', name))
        le = labels.pop("le", None)
        key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        entry = out.setdefault(key, {"buckets": {}})
        if name.startswith("duplex_malloc_trim_seconds_bucket"):
            entry["buckets"][le] = int(float(value))
        elif name.startswith("duplex_malloc_trim_seconds_count"):
            entry["count"] = int(float(value))
        elif name.startswith("duplex_malloc_trim_seconds_sum"):
            entry["sum_s"] = round(float(value), 4)
    for entry in out.values():
        if entry.get("count"):
            entry["mean_ms"] = round(1000 * entry["sum_s"] / entry["count"], 1)
    return out


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    code = commit()  # the code that runs: taken at the start
    out = Path(args.out)
    probe = out.with_suffix(".probe.jsonl")
    probe.unlink(missing_ok=True)
    env = {"PROBE_FILE": str(probe), "PROBE_EVERY_S": str(min(args.sample_s, 5.0))}
    wrapper = [str(Path(__file__).resolve().parent / "_probe_serve.py")]
    samples: list[dict[str, Any]] = []
    async with serve(
        args.serve_args, env=env, log=out.with_suffix(".log"), wrapper=wrapper
    ) as served:
        t0 = time.monotonic()
        load = Load(served.ws("/v1/duplex"), args.sessions, args.seed)

        async def idle(phase: str) -> dict[str, Any]:
            """Once no session is live and the last sockets' tasks have ended (the task
            count the same in two probes in a row, within 30 s)."""
            left = await settle(served.http, timeout_s=60)
            previous = None
            with trio.move_on_after(30):
                while True:
                    await wait_probe(probe, time.monotonic())
                    tasks = _probe_last(probe)["tasks"]
                    if tasks == previous:
                        break
                    previous = tasks
            asked = time.monotonic()
            os.kill(served.pid, signal.SIGUSR1)  # the probe's next sample: a full collection
            await wait_probe(probe, asked, key="gc_live")
            point = await sample(served, probe, t0, phase)
            point["settle_left"] = left
            samples.append(point)
            return point

        await idle("start")
        await load.run(args.warmup_s)
        baseline = await idle("idle-baseline")
        measured_from = time.monotonic() - t0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(load.run, args.seconds)
            await trio.sleep(args.sample_s)
            while time.monotonic() - t0 < measured_from + args.seconds:
                samples.append(await sample(served, probe, t0, "load"))
                await trio.sleep(args.sample_s)
        end = await idle("idle-end")
        trims = malloc_trims(await metrics(served.http))
        problems = log_problems(served.log_lines())
    loaded = [s for s in samples if s["phase"] == "load"]
    xs = [s["t_s"] for s in loaded]
    series = (
        "rss_mb_total",
        "fds_total",
        "tasks",
        "gc_objects",
        "gc_floor",
        "sessions_live",
        "malloc_in_use",
        "malloc_free",
        "pymalloc_blocks",
    )
    idle_series = (*series, "gc_live")
    report = {
        "command": " ".join(["bench/soak.py", *sys.argv[1:]]),
        "machine": machine(),
        "commit": code,
        "sessions": args.sessions,
        "measured_s": args.seconds,
        "warmup_s": args.warmup_s,
        "client_counts": load.counts,
        "client_error_codes": load.error_codes,
        "idle_delta": {
            k: (None if end[k] is None else round(end[k] - baseline[k], 1))
            for k in IDLE_DELTAS
            if baseline.get(k) is not None and end.get(k) is not None
        },
        "idle_baseline": {k: baseline.get(k) for k in idle_series},
        "idle_end": {k: end.get(k) for k in idle_series},
        "slope_per_10min_under_load": {
            k: slope_per_10min(
                [x for x, s in zip(xs, loaded, strict=True) if s.get(k) is not None],
                [s[k] for s in loaded if s.get(k) is not None],
            )
            for k in series
        },
        "under_load_range": {
            k: [min(v), max(v)] if (v := [s[k] for s in loaded if s.get(k) is not None]) else None
            for k in series
        },
        "malloc_trims": trims,
        "server_log": problems,
        "samples": samples,
    }
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    minutes = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(9, 12), sharex=True)
    names = sorted({name for s in samples for name in s["processes"]})
    for name in names:
        axes[0].plot(
            minutes,
            [s["processes"].get(name, {}).get("rss_mb") for s in samples],
            label=name.split("-")[0],
        )
        axes[1].plot(minutes, [s["processes"].get(name, {}).get("fds") for s in samples])
    axes[0].set_ylabel("RSS (MB)")
    axes[0].legend(loc="lower right", fontsize="small")
    axes[1].set_ylabel("open fds")
    axes[2].plot(minutes, [s["tasks"] for s in samples])
    axes[2].set_ylabel("trio tasks\n(server process)")
    axes[3].plot(minutes, [s["gc_objects"] for s in samples], label="tracked (garbage too)")
    axes[3].plot(
        minutes, [s.get("gc_floor") for s in samples], label="after the last full collection"
    )
    idle = [(m, s["gc_live"]) for m, s in zip(minutes, samples, strict=True) if s.get("gc_live")]
    axes[3].plot(*zip(*idle, strict=True), "o", label="live (collected), idle points")
    axes[3].set_ylabel("GC-tracked objects\n(server process)")
    axes[3].legend(loc="upper left", fontsize="small")
    axes[4].plot(minutes, [s["sessions_live"] for s in samples])
    axes[4].set_ylabel("live sessions")
    axes[4].set_xlabel("minutes")
    for ax in axes:
        for s, m in zip(samples, minutes, strict=True):
            if s["phase"].startswith("idle"):
                ax.axvline(m, color="grey", linestyle=":", linewidth=0.8)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"soak: {report['sessions']} loopback sessions, {report['measured_s'] / 60:.0f} min "
        f"({report['machine'].split(' (')[0]})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, help="overrides --minutes")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/soak")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("serve_args", nargs="*", help="after --: duplex serve arguments")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = args.minutes * 60
    report = trio.run(soak, args)
    out = Path(args.out)
    write_report(out.with_suffix(".json"), report)
    if not args.no_plot:
        plot(report, out.with_suffix(".png"))
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
