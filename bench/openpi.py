"""Robot policy serving: duplex's batched endpoint against OpenPI's own server, same policy.

    .venv/bin/python bench/openpi.py [--clients 1,8,32,128] [--seconds 10] [--warmup 2]
        [--targets duplex,openpi-server] [--horizon 10] [--dim 8] [--device cpu]
        [--json bench/results/openpi-NAME.json]

Targets, each a server process on loopback serving the same seeded `ReferencePolicy`:

- ``duplex``: ``duplex serve --policy reference`` (WS /v1/realtime/robot/openpi): requests
  of all robots batched into one policy call, run on a worker thread;
- ``openpi-server``: upstream's ``openpi_server.WebsocketPolicyServer`` (PyPI
  ``openpi-server==0.1.0``), which calls ``policy.infer(obs)`` once per request on its
  event loop. It runs in this interpreter with ``openpi-server`` and ``openpi-client``
  installed without their dependencies into ``--upstream`` (their numpy<2 pin is not
  needed by the code); the script installs them there on first use.

And the policy called in-process, one observation per call (no socket): the serving
overhead is a target's round trip over that. The server process's CPU time per answer
(every thread, warm-up included, over the answers of the measured seconds scaled to the
whole run) is read from ``/proc``.

Each robot is one websockets connection, compression off (as openpi-client), that
sends the same observation (two 224 x 224 x 3 uint8 cameras, an 8-value state and a
prompt, about 300 KB) on a 10 Hz grid, each robot at its own phase: step k is due at
``t0 + phase + k * 100 ms``. A step is on time when its answer arrives before step k+1
is due; a late answer delays the next send (a robot never has two requests out). A
robot is held at 10 Hz when at least 99% of its measured steps were on time. The load
generator shares the machine with the server: record the machine with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import trio
from websockets.trio.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from duplex.models import PolicyOptions, PolicyRequest, load_policy  # noqa: E402
from duplex.wire._openpi import pack, unpack  # noqa: E402

PATH = "/v1/realtime/robot/openpi"
PERIOD_S = 0.1
UPSTREAM_PACKAGES = ("openpi-server==0.1.0", "openpi-client==0.1.2")

UPSTREAM_SERVER = """
import sys
import torch
from openpi_server import WebsocketPolicyServer
from duplex.models import PolicyOptions, PolicyRequest, load_policy

torch.set_num_threads(1)  # as duplex serve does beside its VAD
port, horizon, dim, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
options = PolicyOptions(action_horizon=horizon, action_dim=dim, device=device)
reference = load_policy(sys.argv[5], options)


class OneAtATime:
    def infer(self, obs):
        (result,) = reference.infer_batch([PolicyRequest(obs)])
        if isinstance(result, Exception):
            raise result
        return dict(result)

    def reset(self):
        pass


print("serving", flush=True)
server = WebsocketPolicyServer(
    OneAtATime(), host="127.0.0.1", port=port, metadata=reference.metadata
)
server.serve_forever()
"""


def observation() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "prompt": "pick up the red block and put it in the bowl",
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_upstream(folder: Path) -> None:
    if (folder / "openpi_server").is_dir() and (folder / "openpi_client").is_dir():
        return
    print(f"installing {', '.join(UPSTREAM_PACKAGES)} into {folder} (no dependencies)")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(folder),
            *UPSTREAM_PACKAGES,
        ],
        check=True,
    )


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def server(target: str, args: argparse.Namespace) -> AsyncIterator[tuple[str, int]]:
    """Start ``target`` on a free port; yields its robot URL, once it answers, and its pid."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_")}
    inherited = os.environ.get("PYTHONPATH", "")  # carried dependencies (a GPU host)
    tail = f"{os.pathsep}{inherited}" if inherited else ""
    if target == "duplex":
        command = [sys.executable, "-m", "duplex.cli", "serve", "--port", str(port)]
        command += ["--policy", args.policy, "--log-level", "warning", "--tts", "none"]
        command += ["--policy-max-batch", str(args.max_batch)]
        command += ["--policy-batch-wait-ms", str(args.wait_ms)]
        env |= {
            "PYTHONPATH": f"{ROOT}{tail}",
            "DUPLEX_POLICY_ACTION_HORIZON": str(args.horizon),
            "DUPLEX_POLICY_ACTION_DIM": str(args.dim),
            "DUPLEX_MODEL_DEVICE": args.device,
            "DUPLEX_REALTIME_VAD": "energy",  # no silero: the server runs the policy only
        }
        url = f"ws://127.0.0.1:{port}{PATH}"
    else:
        ensure_upstream(args.upstream)
        command = [sys.executable, "-c", UPSTREAM_SERVER, str(port), str(args.horizon)]
        command += [str(args.dim), args.device, args.policy]
        env["PYTHONPATH"] = f"{args.upstream}{os.pathsep}{ROOT}{tail}"
        url = f"ws://127.0.0.1:{port}"
    process = await trio.lowlevel.open_process(command, env=env, stdout=subprocess.DEVNULL)
    try:
        with trio.fail_after(120):
            while True:
                try:
                    async with connect(url, compression=None, max_size=None) as ws:
                        await ws.recv()
                    break
                except OSError:
                    await trio.sleep(0.2)
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGINT)
        with trio.move_on_after(15):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def robot(
    url: str,
    frame: bytes,
    phase: float,
    start: float,
    warm_until: float,
    stop: float,
    out: dict[str, Any],
) -> None:
    steps: list[tuple[float, bool]] = []  # (round trip, on time), measured steps only
    server: list[tuple[float, float]] = []  # server_timing (infer_ms, prev_total_ms)
    async with connect(url, compression=None, max_size=None) as ws:
        unpack(await ws.recv())
        k = 0
        while True:
            due = start + phase + k * PERIOD_S
            if due >= stop:
                break
            await trio.sleep_until(due)
            sent = trio.current_time()
            await ws.send(frame)
            reply = unpack(await ws.recv())
            done = trio.current_time()
            if not (isinstance(reply, dict) and "actions" in reply):
                raise RuntimeError(f"unexpected reply: {reply!r}"[:200])
            if due >= warm_until:
                steps.append((done - sent, done <= due + PERIOD_S))
                timing = reply.get("server_timing", {})
                server.append((timing.get("infer_ms", 0.0), timing.get("prev_total_ms", 0.0)))
            k = max(k + 1, math.ceil((done - start - phase) / PERIOD_S))  # late: next tick
    out["steps"] = steps
    out["server"] = server
    out["due"] = int((stop - max(warm_until, start + phase)) / PERIOD_S)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_load(url: str, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    frame = pack(observation())
    start = trio.current_time() + 0.5
    warm_until = start + args.warmup
    stop = warm_until + args.seconds
    results = [dict[str, Any]() for _ in range(clients)]
    rng = np.random.default_rng(1)
    async with trio.open_nursery() as nursery:
        for index in range(clients):
            phase = float(rng.uniform(0, PERIOD_S))
            nursery.start_soon(robot, url, frame, phase, start, warm_until, stop, results[index])
    rtts = [rtt * 1000 for r in results for rtt, _ in r["steps"]]
    held = 0
    for r in results:
        # steps never sent count as missed: a robot held at 10 Hz sent (almost) all its steps
        on_time = sum(ok for _, ok in r["steps"])
        held += on_time >= 0.99 * r["due"]
    answered = len(rtts)
    infer_ms = [i for r in results for i, _ in r["server"]]
    total_ms = [t for r in results for _, t in r["server"] if t]
    return {
        "clients": clients,
        "held": held,
        "answers_per_s": answered / args.seconds,
        "rtt_p50_ms": percentile(rtts, 0.50),
        "rtt_p99_ms": percentile(rtts, 0.99),
        "rtt_max_ms": max(rtts) if rtts else float("nan"),
        "server_infer_p50_ms": percentile(infer_ms, 0.50),
        "server_prev_total_p50_ms": percentile(total_ms, 0.50),
    }


def in_process(args: argparse.Namespace) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    options = PolicyOptions(action_horizon=args.horizon, action_dim=args.dim, device=args.device)
    policy = load_policy(args.policy, options)
    obs = unpack(pack(observation()))
    times = []
    for i in range(args.inprocess_calls + 20):
        begin = time.perf_counter()
        policy.infer_batch([PolicyRequest(obs)])
        if i >= 20:
            times.append((time.perf_counter() - begin) * 1000)
    return {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)}


async def main(args: argparse.Namespace) -> None:
    report: dict[str, Any] = {
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": os.getloadavg(),
        },
        "command": " ".join(sys.argv),
        "in_process": in_process(args),
        "runs": [],
    }
    print("in-process policy call:", report["in_process"])
    for target in args.targets:
        async with server(target, args) as (url, pid):
            for clients in args.clients:
                before = cpu_seconds(pid)
                result = {"target": target, **await run_load(url, clients, args)}
                run_s = args.seconds + args.warmup + 0.5
                answers = result["answers_per_s"] * run_s
                result["server_cpu_ms_per_answer"] = (cpu_seconds(pid) - before) * 1000 / answers
                report["runs"].append(result)
                print(json.dumps(result))
    base = report["in_process"]["p50_ms"]
    print()
    print(
        "| target | robots | held at 10 Hz | answers/s | p50 ms | p99 ms | p50 / in-process "
        "| server infer p50 ms | server prev_total p50 ms | server CPU ms / answer |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["runs"]:
        print(
            f"| {r['target']} | {r['clients']} | {r['held']} | {r['answers_per_s']:.0f} | "
            f"{r['rtt_p50_ms']:.1f} | {r['rtt_p99_ms']:.1f} | {r['rtt_p50_ms'] / base:.1f} | "
            f"{r['server_infer_p50_ms']:.1f} | {r['server_prev_total_p50_ms']:.1f} | "
            f"{r['server_cpu_ms_per_answer']:.2f} |"
        )
    report["machine"]["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,8,32,128")
    parser.add_argument("--targets", default="duplex,openpi-server")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--policy",
        default="reference",
        help="reference, or module:factory (bench.openpi_vit:factory)",
    )
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--wait-ms", type=float, default=2.0)
    parser.add_argument("--inprocess-calls", type=int, default=300)
    parser.add_argument("--upstream", type=Path, default=ROOT / ".openpi-upstream")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.targets = args.targets.split(",")
    return args


if __name__ == "__main__":
    trio.run(main, parse())
