"""Sessions per node and delay with 1, 2 and 3 duplex nodes on one host, in one run.

A local Ray cluster (``ray.cluster_utils.Cluster``, every listener on 127.0.0.1) gets
one more duplex node (loopback model) per round; ``--per-node`` sessions per node
stream a tone at real time through one ingress copy (in this process) for
``--seconds`` after ``--warmup``. Delay is each output's lateness against its run's
best-aligned 80 ms cadence (as ``bench/served.py``). Figures are given as ratios to
the 1-node round, since on a small shared machine the absolute ones mostly measure
the machine.

With ``--ingress-process`` the ingress copy is ``duplex cluster ingress`` in its own
process (as an operator runs it), and each round also gives its CPU (with any process
under it) over the round:
``ingress_cpu_cores`` (CPU seconds per wall second) and ``ingress_cpu_us_per_frame``
(per audio frame relayed, both ways: each session sends and gets one frame a tick).

With ``--kill``, a last round on every node started SIGKILLs one Ray node (its raylet, its
workers and so its duplex server: ``remove_node(allow_graceful=False)``) halfway through
the measured seconds, and reports how long its sessions took to be told (``node_lost``
or a close), the other sessions' delay and missed ticks before and after the kill, and
whether a new session is then placed on a survivor.

    python bench/cluster.py --per-node 8 --seconds 5 --warmup 2 --json out.json
    python bench/cluster.py --nodes 3 --per-node 8 --seconds 8 --warmup 2 --kill
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 (docs/cluster.md)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import argparse
import json
import math
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import numpy as np
import ray
import trio
from ray.cluster_utils import Cluster
from served import PERIOD, _free_port, _measure, _session, _tree_cpu_s
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from duplex.cluster import (
    NODE_RESOURCE,
    Ingress,
    NodeState,
    RayTable,
    serve_ingress,
    start_controller,
)

NODE_ARGS = dict(num_cpus=1, object_store_memory=80 * 1024**2, node_ip_address="127.0.0.1")
SERVE_ENV = {
    "DUPLEX_AGENT": "false",
    "DUPLEX_REALTIME_VAD": "energy",
    "DUPLEX_TTS": "none",
    "DUPLEX_LOG_LEVEL": "warning",
    # every frame the model speaks is sent (as bench/served.py): the loopback echoes the
    # tone 240 ms later, so each session gets one output a tick
    "DUPLEX_SESSION__OVERLAP_POLICY": "model",
}


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


async def _round(
    placed: Callable[[], Awaitable[dict[str, int]]],
    url: str,
    count: int,
    args: argparse.Namespace,
) -> dict:
    """``count`` sessions through the ingress at ``url``; ``placed``: the ingress's sessions
    placed per node so far (the round's split is the difference)."""
    before = await placed()
    results: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        result = await _session(url, index * PERIOD / count, args.warmup, args.seconds)
        if result["admitted"]:
            result = {"admitted": True, **_measure(result, args.warmup, args.seconds)}
        results.append(result)

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    after = await placed()
    per_node = sorted(after.get(n, 0) - before.get(n, 0) for n in after)
    admitted = [r for r in results if r["admitted"]]
    delays = [d for r in admitted for d in r["delays"]]
    return {
        "sessions": count,
        "admitted": len(admitted),
        "sessions_per_node": [n for n in per_node if n],
        "delay_p50_ms": _pct(delays, 50),
        "delay_p99_ms": _pct(delays, 99),
        "missed": sum(r["missed"] for r in admitted),
        "frames": round(
            sum(r["received"] for r in admitted) / max(sum(r["expected"] for r in admitted), 1), 3
        ),
    }


@asynccontextmanager
async def _ingress_of(handle: Any, nodes: int) -> AsyncIterator[tuple[Ingress, str]]:
    """An ingress copy in this process once it sees ``nodes`` serving; its session URL."""
    ingress = Ingress(RayTable(handle), refresh_s=0.1)
    async with trio.open_nursery() as nursery:
        base = await nursery.start(serve_ingress, ingress, "127.0.0.1", 0)
        while sum(n.state is NodeState.SERVING for n in ingress.placement.nodes()) < nodes:
            await trio.sleep(0.1)
        yield ingress, base.replace("http", "ws", 1) + "/v1/duplex"
        nursery.cancel_scope.cancel()
    await ingress.aclose()


def _window(results: list[dict[str, Any]], lo: dict[int, float], hi: dict[int, float]) -> dict:
    """Delay and missed ticks of each session's outputs in ``[lo, hi)`` (its own clock)."""
    delays: list[float] = []
    missed = received = expected = 0
    for i, r in enumerate(results):
        m = _measure(r, lo[i], hi[i] - lo[i])
        delays += m["delays"]
        missed += m["missed"]
        received += m["received"]
        expected += m["expected"]
    return {
        "delay_p50_ms": _pct(delays, 50),
        "delay_p99_ms": _pct(delays, 99),
        "missed": missed,
        "frames": round(received / max(expected, 1), 3),
    }


async def _kill_round(
    url: str, count: int, kill: Callable[[], None], args: argparse.Namespace
) -> dict:
    """``count`` sessions; one Ray node killed (``kill``) halfway through the measured
    seconds; then one new session."""
    results: list[dict[str, Any]] = []
    marks: dict[str, float] = {}

    async def one(index: int) -> None:
        results.append(await _session(url, index * PERIOD / count, args.warmup, args.seconds))

    async def killer() -> None:
        await trio.sleep(args.warmup + args.seconds / 2)
        marks["kill"] = trio.current_time()
        await trio.to_thread.run_sync(kill)
        marks["killed"] = trio.current_time()

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
        nursery.start_soon(killer)
    admitted = [r for r in results if r["admitted"]]
    lost = [r for r in admitted if r.get("error") == "node_lost" or "closed_at" in r]
    kept = [r for r in admitted if r not in lost]
    told = [
        r["started"]
        + min(r.get("error_at", math.inf), r.get("closed_at", math.inf))
        - marks["kill"]
        for r in lost
    ]
    at = {i: marks["kill"] - r["started"] for i, r in enumerate(kept)}
    start = {i: args.warmup for i in at}
    end = {i: args.warmup + args.seconds for i in at}
    try:  # a newcomer after the kill: placed on a survivor once the ingress knows
        after = await _session(url, 0, 0.4, 0.8)
    except (ConnectionClosed, InvalidHandshake, OSError) as exc:
        after = {"admitted": False, "error": repr(exc)}
    return {
        "sessions": count,
        "admitted": len(admitted),
        "lost": len(lost),
        "lost_told": sorted({r.get("error") or f"close {r.get('close_code')}" for r in lost}),
        "told_p50_s": round(float(np.percentile(told, 50)), 3) if told else None,
        "told_max_s": round(max(told), 3) if told else None,
        "remove_node_s": round(marks["killed"] - marks["kill"], 3),
        "others_before": _window(kept, start, at),
        "others_after": _window(kept, at, end),
        "new_session_admitted": bool(after["admitted"]),
    }


def _round_via_cli(address: str, k: int, args: argparse.Namespace) -> dict:
    """One round through ``duplex cluster ingress`` in its own process, with its CPU."""
    port = _free_port()
    command = [sys.executable, "-m", "duplex.cli", "cluster", "ingress", "--loopback",
               "--address", address, "--port", str(port)]  # fmt: skip
    process = subprocess.Popen(command)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the ingress exited"
            try:
                nodes = httpx.get(base + "/health", timeout=2).json().get("nodes", [])
                if sum(n["state"] == "serving" for n in nodes) >= k:
                    break
            except (httpx.TransportError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the ingress did not see every node")
            time.sleep(0.2)

        async def placed() -> dict[str, int]:
            async with httpx.AsyncClient(timeout=10) as http:
                text = (await http.get(base + "/metrics")).text
            found = re.findall(r'^duplex_cluster_placed_total\{node="([^"]+)"\} (\S+)$', text, re.M)
            return {node: int(float(value)) for node, value in found}

        async def measure() -> dict:
            count = k * args.per_node
            cpu, wall = _tree_cpu_s(process.pid), time.monotonic()
            url = base.replace("http", "ws", 1) + "/v1/duplex"
            result = await _round(placed, url, count, args)
            cpu, wall = _tree_cpu_s(process.pid) - cpu, time.monotonic() - wall
            frames = 2 * result["admitted"] * (args.warmup + args.seconds) / PERIOD
            return {
                **result,
                "ingress_cpu_cores": round(cpu / wall, 3),
                "ingress_cpu_us_per_frame": round(cpu / max(frames, 1) * 1e6, 1),
            }

        return trio.run(measure)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2,3", help="node counts, one round each, rising")
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--ingress-process",
        action="store_true",
        help="the ingress as `duplex cluster ingress` in its own process, with its CPU",
    )
    parser.add_argument(
        "--kill",
        action="store_true",
        help="a last round on every node started that SIGKILLs one Ray node halfway",
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]

    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False}
    )
    rounds: list[dict[str, Any]] = []
    try:
        ray.init(address=cluster.address, namespace="duplex", log_to_driver=False)
        handle = start_controller(poll_s=0.25, env=SERVE_ENV)
        hosts: list[Any] = []

        def serving() -> int:
            rows = ray.get(handle.rows.remote(), timeout=10)
            return sum(r.report.state is NodeState.SERVING for r in rows)

        for k in counts:
            while len(hosts) < k:
                hosts.append(cluster.add_node(**NODE_ARGS, resources={NODE_RESOURCE: 1}))
            deadline = time.monotonic() + 120
            while serving() < k:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{k} nodes did not all start")
                time.sleep(0.25)

            if args.ingress_process:
                rounds.append({"nodes": k, **_round_via_cli(cluster.address, k, args)})
                print(json.dumps(rounds[-1]), flush=True)
                continue

            async def measure(k: int = k) -> dict:
                async with _ingress_of(handle, k) as (ingress, url):

                    async def placed() -> dict[str, int]:
                        return dict(ingress.placement.statistics().placed)

                    result = await _round(placed, url, k * args.per_node, args)
                return {"nodes": k, **result}

            rounds.append(trio.run(measure))
            print(json.dumps(rounds[-1]), flush=True)
        if args.kill:

            async def measure_kill(k: int = len(hosts)) -> dict:
                async with _ingress_of(handle, k) as (_, url):
                    kill = partial(cluster.remove_node, hosts[0], allow_graceful=False)
                    result = await _kill_round(url, k * args.per_node, kill, args)
                return {"nodes": k, **result}

            killed = trio.run(measure_kill)
            print(json.dumps(killed), flush=True)
        ray.get(handle.shutdown.remote(), timeout=60)
    finally:
        ray.shutdown()
        cluster.shutdown()
    one = rounds[0]
    for r in rounds:
        r["sessions_per_node_ratio"] = round(
            (r["admitted"] / r["nodes"]) / max(one["admitted"] / one["nodes"], 1e-9), 3
        )
        if one["delay_p99_ms"] and r["delay_p99_ms"] is not None:
            r["delay_p99_ratio"] = round(r["delay_p99_ms"] / one["delay_p99_ms"], 2)
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    report = {
        "machine": f"{platform.machine()}, {cpu} cores, python {platform.python_version()}",
        "args": vars(args),
        "wall_s": round(time.monotonic() - started, 1),
        "rounds": rounds,
        **({"kill": killed} if args.kill else {}),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
