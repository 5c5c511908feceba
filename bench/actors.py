"""Actor runtime throughput and latency against a bare trio memory channel, in one run.

    .venv/bin/python bench/actors.py [--messages N] [--asks N] [--repeats R]

tell: one producer ``await ref.tell(msg)``s N messages to an actor that counts
them; the baseline sends the same messages on a ``trio.open_memory_channel``
of the same capacity (1024) to a task that counts them. ask: sequential
round trips (``await ref.ask(..., timeout=5)``) against a request channel + reply
channel pair, without and with the same 5 s timeout scope around each round trip.
Each figure is the median of R repeats; ratios are ours / bare.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any

import trio

from duplex.actors import Actor, ActorContext, open_actor_system
from duplex.metrics import MetricsRegistry

CAPACITY = 1024


@dataclass(frozen=True, slots=True)
class Msg:
    n: int


class Sink(Actor[Any]):
    def __init__(self, done: trio.Event, expect: int):
        self.count = 0
        self.done = done
        self.expect = expect

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        self.count += 1
        if self.count == self.expect:
            self.done.set()
        return message.n


async def actor_tell(n: int) -> float:
    done = trio.Event()
    async with open_actor_system(registry=MetricsRegistry()) as system:
        ref = await system.spawn(Sink, done, n, name="sink")
        t0 = time.perf_counter()
        for i in range(n):
            await ref.tell(Msg(i))
        await done.wait()
        return time.perf_counter() - t0


async def bare_tell(n: int) -> float:
    send, recv = trio.open_memory_channel[Msg](CAPACITY)
    done = trio.Event()

    async def consume() -> None:
        count = 0
        async for _ in recv:
            count += 1
            if count == n:
                done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        t0 = time.perf_counter()
        for i in range(n):
            await send.send(Msg(i))
        await done.wait()
        elapsed = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return elapsed


async def actor_ask(n: int) -> list[float]:
    async with open_actor_system(registry=MetricsRegistry()) as system:
        ref = await system.spawn(Sink, trio.Event(), -1, name="sink")
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            await ref.ask(Msg(i), timeout=5)
            out.append(time.perf_counter() - t0)
        return out


async def bare_ask(n: int, timeout: float | None = None) -> list[float]:
    req_send, req_recv = trio.open_memory_channel[Msg](CAPACITY)
    rep_send, rep_recv = trio.open_memory_channel[int](1)

    async def serve() -> None:
        async for m in req_recv:
            await rep_send.send(m.n)

    out = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        for i in range(n):
            t0 = time.perf_counter()
            if timeout is None:
                await req_send.send(Msg(i))
                await rep_recv.receive()
            else:  # what an ask with a timeout costs on bare channels
                with trio.move_on_after(timeout):
                    await req_send.send(Msg(i))
                    await rep_recv.receive()
            out.append(time.perf_counter() - t0)
        nursery.cancel_scope.cancel()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--asks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    ours_t, bare_t, ours_a, bare_a, bare_at = [], [], [], [], []
    for _ in range(args.repeats):  # interleaved so drift hits both equally
        bare_t.append(args.messages / trio.run(bare_tell, args.messages))
        ours_t.append(args.messages / trio.run(actor_tell, args.messages))
        bare_a.append(trio.run(bare_ask, args.asks))
        bare_at.append(trio.run(bare_ask, args.asks, 5.0))
        ours_a.append(trio.run(actor_ask, args.asks))
    ours_lat = [x for run in ours_a for x in run]
    bare_lat = [x for run in bare_a for x in run]
    bare_t_lat = [x for run in bare_at for x in run]
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "trio": trio.__version__,
        "tell_msgs_per_s": {"actor": statistics.median(ours_t), "bare": statistics.median(bare_t)},
        "ask_rtt_us": {
            "actor": {"p50": pct(ours_lat, 0.5) * 1e6, "p99": pct(ours_lat, 0.99) * 1e6},
            "bare": {"p50": pct(bare_lat, 0.5) * 1e6, "p99": pct(bare_lat, 0.99) * 1e6},
            "bare_with_timeout": {
                "p50": pct(bare_t_lat, 0.5) * 1e6,
                "p99": pct(bare_t_lat, 0.99) * 1e6,
            },
        },
    }
    result["tell_throughput_ratio"] = (
        result["tell_msgs_per_s"]["actor"] / result["tell_msgs_per_s"]["bare"]
    )
    rtt = result["ask_rtt_us"]
    result["ask_p50_ratio"] = rtt["actor"]["p50"] / rtt["bare"]["p50"]
    result["ask_p50_ratio_vs_bare_with_timeout"] = (
        rtt["actor"]["p50"] / rtt["bare_with_timeout"]["p50"]
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
