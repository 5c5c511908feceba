"""What clients get from ``duplex serve`` with many real-time sessions, over real WebSockets.

    .venv/bin/python bench/served.py --counts 1,32,64,128 [--seconds 8] [--warmup 2]
        [--client-procs 4] [--client-nice N] [--url http://HOST:PORT] [--engine-bench]
        [--step-down [--settle 3]] [--out FILE.json]
        [-- duplex serve ARGS, e.g. --model moshi-7b --random-weights --kv-cache-dtype fp8
            --model-device cuda]

Unless ``--url`` names a running server, it starts ``duplex serve`` with the given
arguments (``session.overlap_policy = model``: every frame the model speaks is sent)
once, waits for ``/health``, and for each N in ``--counts``: N ``/v1/duplex``
sessions (spread over ``--client-procs`` load-generator processes, so the client's
own event loop is not what is measured) open with staggered starts (spread over
one frame period), each streams a 440 Hz tone as 80 ms PCM16 frames on an
absolute real-time schedule, and reads every event. The processes share one clock:
the measure window is the ``--seconds`` that begin ``--warmup`` seconds after the
last session was due to start, and only outputs received inside it count.

With ``--step-down``, every N is measured in one stream: the largest N opens, and after
each window the sessions above the next N close (``--settle`` seconds to leave) and the
next window measures the rest, each of them still carrying its whole history. Sessions
are admitted in tiers (the longest-lived first, ``TIER_GAP`` apart) so that the survivors
hold the lowest slots and the engine's step shrinks to the next N's batch. A run whose
warm-up outlasts the model's context (Moshi: 3,000 frames, 240 s) so measures every N at
full context for one warm-up, not one per N.

Per session, its audio deltas arrive in runs (a response: consecutive engine ticks
while the model speaks). Within a run, output j should arrive ``j * 80 ms`` after
the run's start, set by its best-aligned output (the least ``arrival_j - j * 80 ms``);
its **delay** is how much later than that it arrived (0 for a server that keeps its
cadence; a server falling behind shows a growing delay). Outputs count when they
arrive inside the measure window.
A **missed tick** is a gap of 1.5 periods or more between two outputs of a run
(``round(gap / 80 ms) - 1`` ticks). ``frames_ratio``: frames received / frames the
measure window should have held (1.0 while the model speaks throughout, as the
loopback and Moshi with random weights do).

Also per N: server CPU (user + system seconds of the server process and every
process under it, over the measure window, per wall second), the GPU's used
memory (``nvidia-smi``, its peak since the window before), and from ``/metrics`` the
engine's step-time p99, late ticks, underruns, warm-up steps (those that captured a CUDA
graph) and dropped outputs over the window, and the slot span at its end (highest live
slot + 1: the rows the step ran). An N given as ``capacity`` is the sessions ``/health``
said the server admits once ready (the pool's size): the largest N it offers. With
``--engine-bench`` (one GPU), ``bench/duplex_engine.py`` runs once the server has stopped,
on the GPU it left, at the Ns served (``capacity`` as the server resolved it) and the
server's precisions (the staggered phase of its ``--kv-cache-dtype``, or every ring full
with ``--engine-context full``; its ``--weight-dtype`` and ``--codec-dtype``), and each N's
served step p99 is given as a ratio to it: the step gauge's
(``served_over_engine_step``: its last 30 s, which reach back past a step-down's window)
and the window's own (``window_over_engine_step``, from the step histogram's buckets).

With ``--sleep-wake``, before the counts the idle engine is put to sleep and woken
(``POST /v1/omni/sleep``, ``/v1/omni/wakeup``): the report's ``sleep_wake`` has both answers
(their memory figures, the time to wake) and the device's used memory before, asleep and
after; every N then runs on the woken engine.

With ``--beside-images K`` (a server started with ``--image-model``), the images'
share is measured in the same run: ``bench/images_load.py`` (K clients posting one
``--image-size`` image of ``--image-steps`` steps back to back) alone for the same
span as one N, then each N alone as above, then each N again with the image clients
running beside it (``--rounds R``: R such pairs in turn); each row gains the images per
minute alone and beside, the realtime delay p99 beside, and both as ratios to alone
(issue: realtime p99 ratio at most 1.1, images at least 0.8 of alone); with rounds,
the p99s pool every round's delays and the images per minute are the rounds' mean.
Each phase also gives the engine's tick lateness p99 and step p50/p99 and the server
process's event-loop lag p99 (from their histograms' buckets: as coarse as they are),
which tell a tick loop kept from its timer, a slower step and a busy server apart.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from _source import source_info
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

FRAME = 1920  # 80 ms at 24 kHz
PERIOD = 0.08
TIER_GAP = 4.0  # s between a step-down's admission tiers: whole periods, so phases hold
LOADERS_START_S = 3.0  # the load generators' start-up (imports) before a stream's epoch
ROOT = Path(__file__).resolve().parent.parent


def _tone(k: int) -> str:
    n = np.arange(k * FRAME, (k + 1) * FRAME)
    pcm = (0.3 * np.sin(2 * np.pi * 440 * n / 24000) * 32767).astype("<i2").tobytes()
    audio = base64.b64encode(pcm).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio, "sample_rate": 24000})


@dataclass(frozen=True)
class Plan:
    """One stream of sessions on a shared clock (seconds from its epoch): when each starts,
    the measure windows it lives through, and when it leaves.

    ``counts`` (descending) are the windows' session counts: session ``i`` streams through
    window ``k`` while ``i < counts[k]``, so after each window the highest-numbered sessions
    close and the next window measures fewer, every one still at its full history. Sessions
    are admitted in tiers, the longest-lived first (``TIER_GAP`` apart), so the scheduler's
    lowest-free-slot-first rule gives the survivors the lowest slots: the step the next window
    runs is the smaller batch's, as it would be for a run of that many."""

    counts: tuple[int, ...]
    warmup: float
    seconds: float
    settle: float = 0.0

    def last_window(self, index: int) -> int:
        return sum(index < count for count in self.counts) - 1

    def start(self, index: int) -> float:
        tier = len(self.counts) - 1 - self.last_window(index)
        return tier * TIER_GAP + index * PERIOD / self.counts[0]

    def window(self, k: int) -> tuple[float, float]:
        begin = (len(self.counts) - 1) * TIER_GAP + PERIOD + self.warmup
        begin += k * (self.seconds + self.settle)
        return begin, begin + self.seconds

    def end(self, index: int) -> float:
        return self.window(self.last_window(index))[1]


async def _session(url: str, epoch: float, plan: Plan, index: int) -> dict[str, Any]:
    """Session ``index`` of ``plan``, whose clock starts at ``epoch`` (``time.time()``): what
    it measured in each of its windows. The first ``error`` event is noted (``error`` /
    ``error_at``); a session the server closes stops sending and says when and how
    (``close_code`` / ``closed_at``)."""
    zero = trio.current_time() + epoch - time.time()  # the epoch on trio's clock
    await trio.sleep_until(zero + plan.start(index))
    async with connect(url, max_queue=None, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.create"}))
        with trio.fail_after(60):
            first = json.loads(await ws.recv())
        if first["type"] != "session.created":
            return {"admitted": False, "error": first.get("error", first)}
        arrivals: list[tuple[float, str]] = []  # (receipt from the epoch, response id)
        ended: dict[str, Any] = {}
        start = trio.current_time()
        stop = zero + plan.end(index)

        async def read() -> None:
            try:
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == "response.audio.delta":
                        arrivals.append((trio.current_time() - zero, event["response_id"]))
                    elif event["type"] == "error" and "error" not in ended:
                        ended["error"] = event["error"].get("code")
                        ended["error_at"] = trio.current_time() - zero
            except ConnectionClosed as closed:
                ended["closed_at"] = trio.current_time() - zero
                ended["close_code"] = closed.rcvd.code if closed.rcvd else None

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                k = 0
                while start + k * PERIOD < stop:
                    await trio.sleep_until(start + k * PERIOD)
                    await ws.send(_tone(k))
                    k += 1
                await trio.sleep(0.5)  # outputs of the last frames
                nursery.cancel_scope.cancel()
            await ws.send(json.dumps({"type": "session.close"}))
        except* ConnectionClosed:
            pass  # the server ended it: `read` noted when and how
    return {"admitted": True, "arrivals": arrivals, "started": start - zero, **ended}


def _measure(result: dict[str, Any], begin: float, end: float) -> dict[str, Any]:
    """Delays and missed ticks of one session's runs inside the window ``[begin, end)``."""
    runs: dict[str, list[float]] = {}
    for at, response in result["arrivals"]:
        runs.setdefault(response, []).append(at)
    delays: list[float] = []
    missed = received = 0
    first_output = None
    for times in runs.values():
        if first_output is None:
            first_output = times[0] - result["started"]
        # the run's cadence is set by its best-aligned output: delay is lateness against it
        base = min(at - j * PERIOD for j, at in enumerate(times))
        for j, at in enumerate(times):
            if not begin <= at < end:
                continue
            received += 1
            delays.append(at - (base + j * PERIOD))
            if j:
                gap = at - times[j - 1]
                if gap >= 1.5 * PERIOD:
                    missed += round(gap / PERIOD) - 1
    return {
        "delays": delays,
        "missed": missed,
        "received": received,
        "expected": round((end - begin) / PERIOD),
        "first_output_s": first_output,
    }


async def _load(url: str, epoch: float, plan: Plan, first: int, count: int) -> list:
    """Sessions ``first .. first + count`` of ``plan``: each one's figures per window."""
    results: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        result = await _session(url, epoch, plan, index)
        if result["admitted"]:
            windows = [
                _measure(result, *plan.window(k)) for k in range(plan.last_window(index) + 1)
            ]
            result = {"admitted": True, "windows": windows}
        results.append({"index": index, **result})

    async with trio.open_nursery() as nursery:
        for index in range(first, first + count):
            nursery.start_soon(one, index)
    return results


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live process under it."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent = int(fields[1])
        children.setdefault(parent, []).append(int(entry))
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += children.get(current, [])
    return total


def _gpu_memory_mib() -> list[int] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [int(line) for line in out.split()] or None


LATENESS = "duplex_engine_tick_lateness_seconds"
STEPS = "duplex_engine_step_seconds"
LAG = "duplex_event_loop_lag_seconds"
SPAN = "duplex_engine_slot_span"
CAPACITY = "capacity"  # in --counts: as many sessions as /health said the server admits
ENGINE_PRESETS = ("tiny", "moshi-7b")  # the presets bench/duplex_engine.py builds


def _buckets(text: str, name: str) -> dict[float, float]:
    """Histogram ``name``'s cumulative bucket counts by upper bound, summed over labels."""
    counts: dict[float, float] = {}
    for labels, value in re.findall(rf"^{name}_bucket\{{([^}}]*)\}} (\S+)$", text, re.M):
        bound = re.search(r'le="([^"]+)"', labels)
        if bound:
            le = float(bound.group(1))
            counts[le] = counts.get(le, 0.0) + float(value)
    return counts


def _bucket_pct_ms(
    before: dict[float, float], after: dict[float, float], q: float = 99
) -> float | None:
    """The ``q``th percentile of what a histogram observed between two scrapes, interpolated
    linearly within its bucket (coarse: as fine as the buckets)."""
    bounds = sorted(after)
    cumulative = [after[b] - before.get(b, 0.0) for b in bounds]
    if not cumulative or cumulative[-1] <= 0:
        return None
    target = q / 100 * cumulative[-1]
    low, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= target:
            if bound == float("inf"):
                return round(low * 1000, 2)
            share = (target - below) / (count - below) if count > below else 1.0
            return round((low + share * (bound - low)) * 1000, 2)
        low, below = bound, count
    return None


async def _metrics(http: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(http + "/metrics")).text
    wanted = (
        "duplex_engine_step_p99_seconds",
        "duplex_engine_late_ticks_total",
        "duplex_engine_underruns_total",
        "duplex_engine_outputs_dropped_total",
        "duplex_engine_ticks_total",
        "duplex_engine_warmup_steps_total",
        "duplex_engine_slack_units_total",
        "duplex_engine_slack_deferred_total",
        "duplex_engine_slack_overran_total",
        "duplex_engine_slack_beside_total",
    )
    values: dict[str, Any] = {name: _buckets(text, name) for name in (LATENESS, STEPS, LAG)}
    for name in (*wanted, SPAN):
        found = [float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)]
        if found:  # the widest engine's span; counters summed over engines
            values[name] = max(found) if name == SPAN else sum(found)
    return values


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


async def _wait_ready(
    http: str, timeout_s: float, server: subprocess.Popen | None
) -> tuple[float, dict[str, Any]]:
    """Seconds until ``/health`` is ok with no session live, and that ``/health`` body (its
    capacity and the layout the server chose are part of the report)."""
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() - start < timeout_s:
            if server is not None and server.poll() is not None:
                raise SystemExit(f"duplex serve exited with {server.returncode}")
            try:
                response = await client.get(http + "/health")
                if response.status_code == 200 and not response.json()["sessions"]["live"]:
                    return time.monotonic() - start, response.json()
            except httpx.TransportError:
                pass
            await trio.sleep(0.5)
    raise SystemExit(f"/health not ok and idle after {timeout_s} s")


async def _one_count(
    args: argparse.Namespace, http: str, n: int, server_pid: int | None
) -> dict[str, Any]:
    """N sessions streamed through one window."""
    (row,) = await _stream(args, http, (n,), server_pid)
    return row


async def _stream(
    args: argparse.Namespace, http: str, counts: tuple[int, ...], server_pid: int | None
) -> list[dict[str, Any]]:
    """One `Plan` over ``--client-procs`` load generators: a row per window, with the
    server's own figures (metrics, CPU, GPU memory) over that window."""
    plan = Plan(counts, args.warmup, args.seconds, args.settle if len(counts) > 1 else 0.0)
    url = http.replace("http://", "ws://") + "/v1/duplex"
    n = counts[0]
    procs = min(args.client_procs, n)
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    epoch = time.time() + LOADERS_START_S
    commands = []
    first = 0
    for share in shares:
        commands.append(
            [
                sys.executable, __file__, "--load", url, "--load-range", f"{first},{share}",
                "--epoch", repr(epoch), "--counts", ",".join(map(str, counts)),
                "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                "--settle", str(plan.settle),
            ]
        )  # fmt: skip
        first += share
    if args.client_nice:  # the load generators yield the host's cores to the server
        commands = [["nice", "-n", str(args.client_nice), *c] for c in commands]
    server: list[dict[str, Any]] = []  # per window: metrics and CPU at its edges, GPU peak
    memory: list[tuple[float, list[int]]] = []

    async def watch() -> None:
        for k in range(len(counts)):
            begin, end = plan.window(k)
            await trio.sleep_until(trio.current_time() + epoch + begin - time.time())
            cpu = _tree_cpu_s(server_pid) if server_pid else None
            edges = {"metrics": await _metrics(http), "cpu": cpu, "wall": time.monotonic()}
            await trio.sleep_until(trio.current_time() + epoch + end - time.time())
            edges["after"] = await _metrics(http)
            if server_pid:
                edges["cpu_s"] = _tree_cpu_s(server_pid) - edges["cpu"]
            edges["wall"] = time.monotonic() - edges["wall"]
            server.append(edges)

    # Each loader writes its JSON to a file, not a pipe: a pipe nobody reads while they run
    # fills at 64 KiB (about 30 sessions' delays) and the loader blocks on it forever.
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as files:
        outputs = [files.enter_context(tempfile.TemporaryFile(mode="w+")) for _ in commands]
        loaders = [subprocess.Popen(c, stdout=o) for c, o in zip(commands, outputs, strict=True)]
        # a session ends within its frames plus 60 s to be admitted and 10 s to close
        deadline = time.monotonic() + LOADERS_START_S + plan.window(len(counts) - 1)[1] + 120
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            while any(p.poll() is None for p in loaders):
                if time.monotonic() > deadline:
                    stuck = sum(p.poll() is None for p in loaders)
                    for loader in loaders:
                        loader.kill()
                    raise SystemExit(f"N={n}: {stuck} of {len(loaders)} load generators hung")
                used = _gpu_memory_mib()
                if used is not None:
                    memory.append((time.time() - epoch, used))
                await trio.sleep(0.5)
        for output in outputs:
            output.seek(0)
            results += json.loads(output.read())
    rows = []
    for k, count in enumerate(counts):
        mine = [r for r in results if r["index"] < count]
        admitted = [r["windows"][k] for r in mine if r["admitted"]]
        edges = server[k]
        previous = plan.window(k - 1)[1] if k else float("-inf")
        peaks = [used for at, used in memory if previous <= at < plan.window(k)[1]]
        rows.append(
            _row(count, admitted, [r["error"] for r in mine if not r["admitted"]], edges, peaks)
        )
        if len(counts) > 1:
            rows[-1]["window_s"] = [round(t, 2) for t in plan.window(k)]
    return rows


def _row(
    n: int,
    admitted: list[dict[str, Any]],
    refused: list[Any],
    edges: dict[str, Any],
    memory: list[list[int]],
) -> dict[str, Any]:
    """One window's row: what its sessions measured, and the server over the window."""
    before, after = edges["metrics"], edges["after"]
    delays = [d for r in admitted for d in r["delays"]]
    received = sum(r["received"] for r in admitted)
    expected = sum(r["expected"] for r in admitted)
    cpu = edges["cpu_s"] / edges["wall"] if "cpu_s" in edges and edges["wall"] > 0 else None
    row = {
        "sessions": n,
        "admitted": len(admitted),
        "refused": refused[:3],
        "delay_p50_ms": _pct(delays, 50),
        "delay_p99_ms": _pct(delays, 99),
        "delay_max_ms": _pct(delays, 100),
        "missed_ticks": sum(r["missed"] for r in admitted),
        "frames_ratio": round(received / expected, 3) if expected else None,
        "first_output_p50_ms": _pct(
            [r["first_output_s"] for r in admitted if r["first_output_s"] is not None], 50
        ),
        "server_cpu_cores": round(cpu, 2) if cpu is not None else None,
        "gpu_memory_mib": [max(column) for column in zip(*memory, strict=True)] or None,
        "step_p99_ms": round(after.get("duplex_engine_step_p99_seconds", 0) * 1000, 1),
        # the rows the step ran at the window's end (highest live slot + 1; widest engine)
        "slot_span": after.get(SPAN),
        "tick_lateness_p99_ms": _bucket_pct_ms(before[LATENESS], after[LATENESS]),
        # over the whole window, every batch size together (the gauge above: recent steps)
        "step_p50_ms_window": _bucket_pct_ms(before[STEPS], after[STEPS], 50),
        "step_p99_ms_window": _bucket_pct_ms(before[STEPS], after[STEPS]),
        # the server process's own event loop (a sleeper's lateness, 10 ms at a time)
        "server_loop_lag_p99_ms": _bucket_pct_ms(before[LAG], after[LAG]),
        # warmup_steps: steps that captured a CUDA graph (or were an engine's first), which
        # the step figures leave out and the ticks' lateness does not
        **{
            name: after.get(f"duplex_engine_{name}_total", 0)
            - before.get(f"duplex_engine_{name}_total", 0)
            for name in (
                "late_ticks",
                "underruns",
                "warmup_steps",
                "outputs_dropped",
                *(f"slack_{kind}" for kind in ("units", "deferred", "overran", "beside")),
            )
        },
    }
    print(json.dumps(row), file=sys.stderr)
    row["_delays"] = delays  # for rounds pooled (`_beside_images`); not in the report
    return row


def _serve_flag(serve_args: list[str], flag: str) -> str | None:
    """The value a ``duplex serve`` flag is given in ``serve_args`` (``--f V`` or ``--f=V``)."""
    for index, item in enumerate(serve_args):
        if item == flag and index + 1 < len(serve_args):
            return serve_args[index + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


def engine_bench_command(
    counts: list[int], serve_args: list[str], out: Path, context: str = "staggered"
) -> list[str]:
    """``bench/duplex_engine.py`` at the served choices: the phase of the server's
    ``--kv-cache-dtype`` (fp8 when it names none, as before) at ``context`` (staggered
    fills, or every ring full: what sessions served past the ring's length read), its
    ``--weight-dtype`` and ``--codec-dtype``, its ``--model`` where the bench builds that
    preset and ``--model-device cpu``."""
    kv = _serve_flag(serve_args, "--kv-cache-dtype") or "fp8"
    if kv in ("auto", "bf16"):
        phase = "ours" if context == "staggered" else "ours-full"
    else:
        phase = f"ours-{kv}-staggered" if context == "staggered" else f"ours-{kv}"
    command = [
        sys.executable, str(ROOT / "bench" / "duplex_engine.py"), "--phases", phase,
        "--batches", ",".join(map(str, counts)), "--out", str(out),
    ]  # fmt: skip
    for flag in ("--weight-dtype", "--codec-dtype"):
        value = _serve_flag(serve_args, flag)
        if value is not None:
            command += [flag, value]
    model = _serve_flag(serve_args, "--model")
    if model in ENGINE_PRESETS:  # else the bench's default, the 7B
        command += ["--preset", model]
    if _serve_flag(serve_args, "--model-device") == "cpu":
        command += ["--device", "cpu"]
    return command


def _engine_bench(args: argparse.Namespace, counts: list[int]) -> dict[int, float]:
    """The engine alone (`engine_bench_command`): step p99 (ms) per batch size."""
    out = Path(args.engine_out)
    command = engine_bench_command(counts, args.serve_args, out, args.engine_context)
    subprocess.run(command, check=True)
    report = json.loads(out.with_suffix(".json").read_text())
    per_batch = report["phases"][command[command.index("--phases") + 1]].get("per_batch", {})
    return {int(b): float(row["p99_ms"]) for b, row in per_batch.items() if "p99_ms" in row}


async def _images(http: str, args: argparse.Namespace) -> dict[str, Any]:
    """``bench/images_load.py`` for one N's span (warm-up included)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import images_load

    load = argparse.Namespace(
        url=http,
        clients=args.beside_images,
        seconds=LOADERS_START_S + PERIOD + args.warmup + args.seconds,  # a stream's span
        size=args.image_size,
        steps=args.image_steps,
    )
    result = await images_load.main(load)
    print(json.dumps({"images": result}), file=sys.stderr)
    return result


async def _beside_images(
    args: argparse.Namespace, http: str, n: int, server_pid: int | None, alone: dict[str, Any]
) -> dict[str, Any]:
    """N sessions alone, then with the image clients running beside them, ``--rounds``
    times in turn; the p99 ratio pools each side's delays over the rounds (one round's p99
    rests on its slowest 1% of outputs: a few ticks)."""
    rounds: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []
    for index in range(args.rounds):
        if index:  # the last images of the round before stop at their next step
            await trio.sleep(2.0)
        realtime = await _one_count(args, http, n, server_pid)
        beside: dict[str, Any] = {}

        async def images(into: dict[str, Any] = beside) -> None:
            into.update(await _images(http, args))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(images)
            both = await _one_count(args, http, n, server_pid)
        rounds.append((realtime, both, beside))
    alone_delays = [d for realtime, _, _ in rounds for d in realtime.pop("_delays")]
    both_delays = [d for _, both, _ in rounds for d in both.pop("_delays")]
    alone_p99, both_p99 = _pct(alone_delays, 99), _pct(both_delays, 99)
    alone_rate = alone["images_per_min"]
    beside_rate = sum(beside["images_per_min"] for _, _, beside in rounds) / len(rounds)
    realtime, both, beside = rounds[0]
    return {
        **realtime,
        "images_alone": alone,
        "beside": both,
        "images_beside": beside,
        "rounds": [{"realtime": r, "beside": b, "images_beside": i} for r, b, i in rounds[1:]],
        "delay_p99_ms_pooled": alone_p99,
        "beside_delay_p99_ms_pooled": both_p99,
        "realtime_p99_ratio": round(both_p99 / alone_p99, 2) if both_p99 and alone_p99 else None,
        "images_per_min_beside": round(beside_rate, 1),
        "images_ratio": round(beside_rate / alone_rate, 2) if alone_rate else None,
    }


async def _sleep_wake(http: str) -> dict[str, Any]:
    """``POST /v1/omni/sleep`` then ``/v1/omni/wakeup`` on the idle server, with the device's
    used memory (``nvidia-smi``) before, asleep and after, and each answer as it came."""
    figures: dict[str, Any] = {"gpu_used_mib_before": _gpu_memory_mib()}
    async with httpx.AsyncClient(timeout=900) as client:
        started = time.monotonic()
        slept = await client.post(http + "/v1/omni/sleep")
        figures["sleep_wall_s"] = round(time.monotonic() - started, 2)
        figures["sleep"] = {"status": slept.status_code, **slept.json()}
        figures["gpu_used_mib_asleep"] = _gpu_memory_mib()
        started = time.monotonic()
        woke = await client.post(http + "/v1/omni/wakeup")
        figures["wake_wall_s"] = round(time.monotonic() - started, 2)
        figures["wake"] = {"status": woke.status_code, **woke.json()}
    figures["gpu_used_mib_after"] = _gpu_memory_mib()
    return figures


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every N in turn; on SIGTERM (``timeout``) the rows so far are the report. The server
    runs in its own session (so a Ctrl-C reaches it once, from here): it is stopped on the
    way out whatever ends the run, or an orphan would keep the GPU and this stdout."""
    report: dict[str, Any] = {
        "serve_args": args.serve_args,
        "warmup_s": args.warmup,
        "seconds": args.seconds,
        "engine_context": args.engine_context if args.engine_bench else None,
        "source": source_info(),
        "rows": [],
    }
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_sigterm() -> None:
                async for _ in signals:
                    report["stopped"] = "SIGTERM: the rows measured before it"
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_sigterm)
            await _bench(args, report)
            nursery.cancel_scope.cancel()
    return report


async def _bench(args: argparse.Namespace, report: dict[str, Any]) -> None:
    server = None
    http = args.url
    if http is None:
        port = _free_port()
        http = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "DUPLEX_SESSION__OVERLAP_POLICY": "model",
            "DUPLEX_REALTIME_VAD": "energy",  # no silero: /v1/duplex sessions use none
        }
        command = [
            sys.executable, "-m", "duplex.cli", "serve", "--port", str(port),
            "--log-level", "warning", *args.serve_args,
        ]  # fmt: skip
        server = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        ready_s, report["health_at_ready"] = await _wait_ready(http, args.start_timeout_s, server)
        report["ready_after_s"] = round(ready_s, 1)
        if args.sleep_wake:  # then every N below runs on the woken engine
            report["sleep_wake"] = await _sleep_wake(http)
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
            await _wait_ready(http, 60, server)
        alone = await _images(http, args) if args.beside_images else {}
        pid = server.pid if server else None
        for counts in _streams(args, report["health_at_ready"]["sessions"]["capacity"]):
            if args.beside_images:
                rows = [await _beside_images(args, http, counts[0], pid, alone)]
            else:
                rows = await _stream(args, http, counts, pid)
            for row in rows:
                row.pop("_delays", None)  # (beside images: pooled already)
                report["rows"].append(row)
            if args.out:  # each stream's rows as they come: a run cut short keeps them
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
            await _wait_ready(http, 60, server)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    if args.engine_bench:  # on the GPU the server has left, at the Ns it served
        engine = _engine_bench(args, sorted({row["sessions"] for row in report["rows"]}))
        for row in report["rows"]:
            n = row["sessions"]
            if n in engine:
                row["engine_only_step_p99_ms"] = engine[n]
                row["served_over_engine_step"] = round(row["step_p99_ms"] / engine[n], 2)
                if row["step_p99_ms_window"]:  # the gauge's 30 s outlast a step-down window
                    window = row["step_p99_ms_window"] / engine[n]
                    row["window_over_engine_step"] = round(window, 2)


def _counts(text: str) -> list[int | str]:
    return [n if n == CAPACITY else int(n) for n in text.split(",")]


def _streams(args: argparse.Namespace, capacity: int) -> list[tuple[int, ...]]:
    """The streams a run makes: one per N, or with ``--step-down`` one for every N
    (``capacity``: the sessions the server said it admits when it was ready)."""
    counts = [capacity if n == CAPACITY else int(n) for n in args.counts]
    if args.step_down:
        return [tuple(sorted(set(counts), reverse=True))]
    return [(n,) for n in counts]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--counts",
        default="1,32,64,128",
        help="session counts; 'capacity': the sessions /health says the server admits",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per N")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument(
        "--client-nice", type=int, default=0, help="niceness of the load generators (0-19)"
    )
    parser.add_argument("--url", help="a running server (http://HOST:PORT); else one is started")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--engine-bench", action="store_true")
    parser.add_argument("--engine-out", default="out/served_engine")
    parser.add_argument(
        "--engine-context",
        choices=("staggered", "full"),
        default="staggered",
        help="--engine-bench's sessions: at staggered fills, or every ring full (for a run "
        "whose --warmup outlasts the model's context: Moshi's 3000 frames are 240 s)",
    )
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("--beside-images", type=int, default=0, metavar="K")
    parser.add_argument("--image-size", default="512x512")
    parser.add_argument("--image-steps", type=int, default=30)
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --beside-images: alone/beside pairs per N"
    )
    parser.add_argument(
        "--sleep-wake",
        action="store_true",
        help="before the counts: sleep and wake the engine (POST /v1/omni/sleep, /wakeup), "
        "with the device memory before, asleep and after; the counts then run on the woken "
        "engine",
    )
    parser.add_argument(
        "--step-down",
        action="store_true",
        help="one stream for every N: the largest opens, and after each measured window the "
        "sessions above the next N close (every one left keeps its full history: a run past "
        "the ring's length measures each N at full context with one warm-up)",
    )
    parser.add_argument(
        "--settle", type=float, default=3.0, help="with --step-down: seconds between windows"
    )
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--load-range", help=argparse.SUPPRESS)
    parser.add_argument("--epoch", type=float, help=argparse.SUPPRESS)
    parser.add_argument("serve_args", nargs="*", help="after --: duplex serve arguments")
    args = parser.parse_args()
    if args.load:  # a load-generator child: its sessions' measurements as JSON on stdout
        first, count = map(int, args.load_range.split(","))
        plan = Plan(tuple(map(int, _counts(args.counts))), args.warmup, args.seconds, args.settle)
        print(json.dumps(trio.run(_load, args.load, args.epoch, plan, first, count)))
        return 0
    args.counts = _counts(args.counts)
    if args.beside_images and args.step_down:
        parser.error("--step-down and --beside-images measure different things: one at a time")
    report = trio.run(bench, args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
