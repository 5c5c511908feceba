"""Text to speech over HTTP and WebSocket against a real ``duplex serve`` (espeak-ng by default).

    python bench/speech.py --seconds 10 --clients 1,4,16 --out bench/results/speech

Phases, each against the same server:

``latency``   20 requests one after another, a short sentence as WAV: p50/p95 ms.
``load``      for each ``--clients`` count, that many clients posting the short sentence
              back to back for ``--seconds``: requests/s, seconds of audio made per second,
              latency p50/p99, 429s.
``stream``    a 10-sentence text: the whole file's time against the first chunk of
              ``stream: true`` (median of 5).
``socket``    ``WS /v1/audio/speech/stream``: from sending a two-sentence ``input.text`` to
              the first sentence's audio frame (median of 5).

Writes ``<out>.json`` (every figure, the machine and the exact command).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from websockets.trio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import commit, machine, serve, write_report

SHORT = "Hello there, how are you doing today?"
TEN = " ".join(f"This is sentence number {n} of the text." for n in range(1, 11))


def audio_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


def ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else float("nan")


async def latency(http: httpx.AsyncClient) -> dict[str, Any]:
    times, audio = [], 0.0
    for _ in range(20):
        start = time.perf_counter()
        response = await http.post("/v1/audio/speech", json={"input": SHORT})
        times.append(time.perf_counter() - start)
        audio = audio_seconds(response.content)
    return {"requests": 20, "p50_ms": ms(times, 50), "p95_ms": ms(times, 95), "audio_s": audio}


async def load(http: httpx.AsyncClient, clients: int, seconds: float) -> dict[str, Any]:
    times: list[float] = []
    audio = [0.0]
    refused = [0]
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            response = await http.post("/v1/audio/speech", json={"input": SHORT})
            if response.status_code == 429:
                refused[0] += 1
                continue
            times.append(time.perf_counter() - start)
            audio[0] += audio_seconds(response.content)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    elapsed = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": len(times),
        "requests_per_s": round(len(times) / elapsed, 1),
        "audio_s_per_s": round(audio[0] / elapsed, 1),
        "p50_ms": ms(times, 50),
        "p99_ms": ms(times, 99),
        "refused_429": refused[0],
    }


async def stream(http: httpx.AsyncClient) -> dict[str, Any]:
    whole, first = [], []
    for _ in range(5):
        start = time.perf_counter()
        await http.post("/v1/audio/speech", json={"input": TEN})
        whole.append(time.perf_counter() - start)
        start = time.perf_counter()
        body = {"input": TEN, "stream": True, "response_format": "pcm"}
        async with http.stream("POST", "/v1/audio/speech", json=body) as response:
            async for _ in response.aiter_raw():
                first.append(time.perf_counter() - start)
                break
    return {"sentences": 10, "whole_file_ms": ms(whole, 50), "first_chunk_ms": ms(first, 50)}


async def stream_socket(url: str) -> dict[str, Any]:
    firsts = []
    async with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
        for _ in range(5):
            start = time.perf_counter()
            text = "The first sentence is here. And the second one."
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
            got_first = False
            while True:
                message = await ws.recv()
                if isinstance(message, bytes) and not got_first:
                    firsts.append(time.perf_counter() - start)
                    got_first = True
                elif isinstance(message, str) and json.loads(message)["type"] == "session.done":
                    break
    return {"first_audio_ms": ms(firsts, 50)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "command": "python3 bench/speech.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "commit": commit(),
        "tts": args.tts,
    }
    log = Path(args.out + ".log") if args.out else Path("/tmp/duplex-bench-speech.log")
    async with serve(["--tts", args.tts], log=log) as served:
        async with httpx.AsyncClient(base_url=served.http, timeout=120) as http:
            await http.post("/v1/audio/speech", json={"input": "Warm up."})
            report["latency"] = await latency(http)
            print("latency", report["latency"], flush=True)
            report["load"] = []
            for clients in [int(c) for c in args.clients.split(",")]:
                report["load"].append(await load(http, clients, args.seconds))
                print("load", report["load"][-1], flush=True)
            report["stream"] = await stream(http)
            print("stream", report["stream"], flush=True)
        report["socket"] = await stream_socket(served.http)
        print("socket", report["socket"], flush=True)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tts", default="espeak")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--out", default="")
    arguments = parser.parse_args()
    result = trio.run(main, arguments)
    if arguments.out:
        write_report(Path(arguments.out + ".json"), result)
    print(json.dumps(result, indent=2))
