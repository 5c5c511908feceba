"""``/api/chat`` (Moshi's Ogg/Opus protocol) session capacity against ``/v1/duplex``, same model.

    .venv/bin/python bench/chat_sessions.py [--counts 5,10,15,20,30] [--warmup S] [--measure S]
        [--targets duplex,chat] [--out PREFIX]

Both targets are ``duplex serve --model loopback`` (``overlap_policy = model``), started
afresh for each count and target, and measured as ``bench/sessions.py`` measures its
``duplex`` target: N sessions, one 80 ms frame each every 80 ms on an absolute schedule
(20 voiced frames, 5 of digital silence, and again), ``--warmup`` then ``--measure``
seconds; latency ``excess`` = echo receipt - (first engine tick after the send + the
loopback's 240 ms); capacity = the largest count with p99 ``excess`` under
``--budget-ms`` (20) and under 1% of voiced frames lost. The tick grid is probed with one
``/v1/duplex`` session on the idle server in both cases (it is the engine's).

- ``duplex``: ``bench/sessions.py``'s own ``duplex`` target, unchanged (base64 PCM16 in
  JSON, each voiced frame marked with its index in its first samples).
- ``chat``: ``/api/chat``: each session waits for its ``0x00`` handshake, then sends
  ``0x01`` Ogg/Opus messages, one per 80 ms frame, as ``moshi.client`` does. Sample
  markers do not survive Opus, so a voiced frame carries its index in its *tone*:
  frame k is a sine at ``400 + 100 * (k mod 24)`` Hz; an echo (one ``0x01`` message per
  model frame) is decoded and its dominant frequency names the latest frame with that
  residue sent before it (24 frames are 1.92 s apart, far more than any echo takes).
  The input is encoded once, before the run, by ``sphn`` (Kyutai's Ogg/Opus), and the
  same bytes go to every socket (each socket is its own Ogg stream), and the echoes are
  decoded after the measure window from their bytes and receipt times: the load
  generator does no Opus work while it measures. The server does all of it: decode of
  every input frame, encode of every output frame (the echoes, and the silence that
  keeps a Moshi stream flowing through the input's pauses).

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import sphn
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sessions as base  # bench/sessions.py: the same servers, grid and metrics

TONES = 24
F0_HZ, STEP_HZ = 400.0, 100.0
FRAME = base.FRAME_SAMPLES
MIN_RMS = 0.05
"""An echo quieter than this is the silence the stream is kept flowing with."""


def tone_hz(k: int) -> float:
    return F0_HZ + STEP_HZ * (k % TONES)


def chat_messages(frames: int) -> list[bytes]:
    """The ``0x01`` message of each input frame: one Ogg/Opus stream, encoded once."""
    writer = sphn.OpusStreamWriter(base.SAMPLE_RATE)
    t = np.arange(FRAME) / base.SAMPLE_RATE
    out = []
    for k in range(frames):
        pcm = np.zeros(FRAME, np.float32)
        if base.voiced(k):
            pcm = (0.3 * np.sin(2 * np.pi * tone_hz(k) * t)).astype(np.float32)
        out.append(b"\x01" + writer.append_pcm(pcm))
    return out


def residue(pcm: np.ndarray) -> int | None:
    """The frame index mod `TONES` an echo carries (``None``: silence or no tone of ours)."""
    if float(np.sqrt(np.mean(pcm * pcm))) < MIN_RMS:
        return None
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    hz = float(np.fft.rfftfreq(len(pcm), 1 / base.SAMPLE_RATE)[int(np.argmax(spectrum))])
    r = round((hz - F0_HZ) / STEP_HZ)
    return r if 0 <= r < TONES and abs(hz - tone_hz(r)) < STEP_HZ / 3 else None


def chat_url(server: base.Server) -> str:
    return server.url.replace("/v1/duplex", "/api/chat")


async def open_chat(url: str) -> ClientConnection:
    """A socket whose session is live: its handshake came."""
    ws = await connect(url, max_size=None, compression=None, ping_interval=None, open_timeout=30)
    first = await asyncio.wait_for(ws.recv(), 30)
    if first != b"\x00":
        await ws.close()
        raise RuntimeError(f"/api/chat answered {first[:80]!r} instead of the handshake")
    return ws


async def run_chat_step(
    server: base.Server, n: int, args: argparse.Namespace, grid: float
) -> dict[str, Any]:
    """``run_step`` of ``bench/sessions.py`` for ``/api/chat`` (see the module docstring)."""
    frames = math.ceil((args.warmup + args.measure) / base.PERIOD_S)
    first = math.ceil(args.warmup / base.PERIOD_S)
    messages = chat_messages(frames)
    data = base.StepData(
        sent=np.full((n, frames), np.nan),
        due=np.full((n, frames), np.nan),
        received=np.full((n, frames), np.nan),
    )
    sockets: list[ClientConnection] = []
    try:  # one at a time: session j joins phase group j mod phases, as in sessions.py
        for _ in range(n):
            sockets.append(await open_chat(chat_url(server)))
    except Exception as exc:  # refused: the row says so
        await asyncio.gather(*(ws.close() for ws in sockets))
        return {"sessions": n, "refused": n - len(sockets), "refusal": repr(exc)[:300]}
    phases = args.duplex_tick_phases
    offsets = [(j % phases) * base.PERIOD_S / phases for j in range(n)]
    guard = args.guard_ms / 1000
    thetas = [guard + (base.PERIOD_S - guard) * (j + 0.5) / n for j in range(n)]
    now = time.monotonic() + 0.5
    start = grid + math.ceil((now - grid) / base.PERIOD_S) * base.PERIOD_S + base.PERIOD_S
    window = (start + (first - 1) * base.PERIOD_S, start + (frames - 1) * base.PERIOD_S)
    echoes: list[list[tuple[float, bytes]]] = [[] for _ in range(n)]
    cpu: dict[str, float] = {}

    async def sample_cpu(key: str, when: float) -> None:
        await base._sleep_until(when)
        cpu[key + "_wall"] = time.monotonic()
        cpu[key + "_server"] = base.cpu_seconds(server.pid)
        cpu[key + "_client"] = time.process_time()
        cpu[key + "_machine"], cpu[key + "_steal"] = base.machine_cpu_seconds()

    async def send(j: int, ws: ClientConnection) -> None:
        theta = thetas[j] - offsets[j]
        for k in range(frames):
            due = start + k * base.PERIOD_S - theta
            await base._sleep_until(due)
            data.due[j, k] = due
            data.sent[j, k] = time.monotonic()
            await ws.send(messages[k])

    async def receive(j: int, ws: ClientConnection) -> None:
        with contextlib.suppress(Exception):
            async for message in ws:
                t = time.monotonic()
                if isinstance(message, bytes) and message[:1] == b"\x01":
                    echoes[j].append((t, message[1:]))
                elif isinstance(message, bytes) and message[:1] == b"\x05":
                    if len(data.errors) < 5:
                        data.errors.append(message[1:].decode(errors="replace")[:300])
                else:
                    data.events[f"kind {message[:1]!r}"] += 1

    receivers = [asyncio.create_task(receive(j, ws)) for j, ws in enumerate(sockets)]
    samplers = [
        asyncio.create_task(sample_cpu("start", window[0])),
        asyncio.create_task(sample_cpu("end", window[1])),
    ]
    gc.collect()
    gc.disable()  # as sessions.py: the load generator's collector stays out of the timing
    try:
        await asyncio.gather(*(send(j, ws) for j, ws in enumerate(sockets)), *samplers)
        await asyncio.sleep(base.MODEL_DELAY_S + base.PERIOD_S + args.drain)
    finally:
        gc.enable()
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    for task in receivers:
        task.cancel()
    await asyncio.gather(*receivers, return_exceptions=True)

    for j in range(n):  # after the run: decode each session's echoes, match them by tone
        reader = sphn.OpusStreamReader(base.SAMPLE_RATE)
        for t, payload in echoes[j]:
            pcm = reader.append_bytes(payload)
            data.events["0x01"] += 1
            r = None if len(pcm) < FRAME else residue(pcm[-FRAME:])
            if r is None:
                data.events["<silent or unknown>"] += 1
                continue
            candidates = [
                k
                for k in range(r, frames, TONES)
                if base.voiced(k) and data.sent[j, k] < t < data.sent[j, k] + TONES * 0.08
            ]
            if not candidates:
                data.events["<unmatched tone>"] += 1
            elif math.isnan(data.received[j, candidates[-1]]):
                data.received[j, candidates[-1]] = t
            else:
                data.duplicates += 1
    ticks = np.full(n, grid) + np.array(offsets)
    result = base.summarize(data, first, ticks, base.MODEL_DELAY_S)
    wall = cpu["end_wall"] - cpu["start_wall"]
    used = {k: 100 * (cpu["end_" + k] - cpu["start_" + k]) / wall for k in base.cpu_keys(cpu)}
    result.update(
        sessions=n,
        refused=0,
        server_cpu_pct=round(used["server"], 1),
        client_cpu_pct=round(used["client"], 1),
        machine_busy_pct=round(used["machine"], 1),
        foreign_cpu_pct=round(used["machine"] - used["server"] - used["client"], 1),
        steal_pct=round(used["steal"], 1),
        server_rss_mib=round(base.rss_mib(server.pid), 1),
        events=dict(data.events),
        duplicate_echoes=data.duplicates,
        errors=data.errors,
    )
    return result


async def measure_chat(n: int, args: argparse.Namespace) -> dict[str, Any]:
    server = base.duplex_server(args.out_path, name="chat")
    await asyncio.to_thread(server.start)
    try:
        grid = await base.estimate_grid(server.url, base.TARGETS["duplex"])
        await base.wait_quiet(server, args)
        row = await run_chat_step(server, n, args, grid[0][0])
        row["grid"] = {"phase_ms": round(grid[0][0] * 1000, 2)}
    finally:
        exit_code = await asyncio.to_thread(server.stop)
    row["server_command"] = server.command
    row["server_exit"] = exit_code
    return row


async def bench(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.targets}
    live = set(args.targets)
    for n in args.counts:
        for name in args.targets:
            if name not in live:
                continue
            attempts = []
            for _ in range(args.retries + 1):
                if name == "chat":
                    row = await measure_chat(n, args)
                else:
                    row = await base.measure_once("duplex", n, args)
                base.report_row(name, row)
                attempts.append(row)
                if row.get("refused") or row["foreign_cpu_pct"] <= args.max_foreign_pct:
                    break
            row = min(attempts, key=lambda r: r.get("foreign_cpu_pct", math.inf))
            results[name].append(row)
            if base.collapsed(row, args):
                live.discard(name)
        if not live:
            break
    return results


def markdown(report: dict[str, Any]) -> str:
    def cell(row: dict[str, Any] | None, key: str) -> str:
        if row is None:
            return "—"
        if row.get("refused"):
            return "refused"
        value = row[key]
        return f"{value['p50']:g} / {value['p99']:g}" if isinstance(value, dict) else f"{value:g}"

    names = list(report["results"])
    rows = {name: {r["sessions"]: r for r in report["results"][name]} for name in names}
    columns = [
        (f"{name} {label}", name, key)
        for name in names
        for label, key in (
            ("excess p50 / p99", "excess_ms"),
            ("lost %", "lost_pct"),
            ("server CPU %", "server_cpu_pct"),
            ("other CPU %", "foreign_cpu_pct"),
        )
    ]
    lines = [
        "| sessions | " + " | ".join(c[0] for c in columns) + " |",
        "|---:|" + "---:|" * len(columns),
    ]
    for n in sorted(set().union(*rows.values())):
        cells = [cell(rows[name].get(n), key) for _, name, key in columns]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    caps = report["capacity"]
    budget = report["params"]["budget_ms"]
    lines += [
        "",
        f"Capacity (p99 excess under {budget:g} ms, under 1% lost): "
        + ", ".join(f"{name} {caps[name]}" for name in names),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="5,10,15,20,30,40", help="session counts, in order")
    parser.add_argument("--targets", default="duplex,chat", help="from duplex,chat, in order")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--measure", type=float, default=8.0)
    parser.add_argument("--drain", type=float, default=1.5)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--guard-ms", type=float, default=20.0)
    parser.add_argument("--duplex-tick-phases", type=int, default=4)
    parser.add_argument("--budget-ms", type=float, default=20.0)
    parser.add_argument("--collapse-ms", type=float, default=500.0)
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--max-foreign-pct", type=float, default=25.0)
    parser.add_argument("--quiet-wait", type=float, default=5.0)
    parser.add_argument("--out", default="out/chat-sessions")
    args = parser.parse_args()
    args.counts = [int(c) for c in args.counts.split(",")]
    args.targets = [t for t in args.targets.split(",") if t]
    if not set(args.targets) <= {"duplex", "chat"}:
        parser.error("--targets: choose from duplex, chat")
    # what bench/sessions.py's duplex target reads
    args.duplex_src, args.duplex_env, args.duplex_gc = None, {}, ""
    args.workers, args.shards = 0, 1
    out = Path(args.out)
    if not out.is_absolute():
        out = base.ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    args.out_path = out
    results = asyncio.run(bench(args))
    report = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": base.machine(),
        "params": {
            "counts": args.counts,
            "warmup_s": args.warmup,
            "measure_s": args.measure,
            "guard_ms": args.guard_ms,
            "duplex_tick_phases": args.duplex_tick_phases,
            "budget_ms": args.budget_ms,
            "tones": TONES,
        },
        "capacity": {name: base.capacity(rows, args.budget_ms) for name, rows in results.items()},
        "results": results,
    }
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"results: {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
