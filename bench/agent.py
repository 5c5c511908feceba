"""The voice agent's latency: end of user speech to first reply audio, barge-in reaction,
and how many concurrent agent sessions keep first audio under a second.

    python bench/agent.py [--turns 20] [--barge-ins 10] [--sessions 1,2,4,8]
        [--silence-ms MS] [--asr DIR] [--out bench/results/agent] [-- duplex serve ARGS]

Runs a real ``duplex serve`` (the default agent: silero VAD, pocketsphinx, the echo
responder, espeak-ng) and talks to ``/v1/realtime`` like a microphone: the espeak-ng
fixtures of tests/fixtures/speech, sent in 80 ms frames at real-time pace, silence in
between (a microphone never stops sending).

- first audio: from the end of the user's speech (when its last loud sample was sent,
  at real-time pace) to the first ``response.output_audio.delta``; also from the server's
  ``speech_stopped`` (the part after the VAD's silence wait, ``silence_duration_ms``).
- barge-in: a second utterance over the reply; from the onset of its speech to the last
  audio delta of the interrupted reply, and to its ``response.done`` (cancelled).
- capacity: N sessions at once, each taking turns with random gaps; first-audio p50/p95
  per N, up to the first N whose p95 is over a second.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import wave
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import trio
from websockets.trio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _served import ROOT, commit, machine, serve, write_report

SPEECH = ROOT / "tests" / "fixtures" / "speech"
FRAME_BYTES = 3840  # 80 ms of PCM16 at 24 kHz
PERIOD = 0.08
AGENT_ENV = {  # the server's defaults (the reliability benches' base env changes these two)
    "DUPLEX_REALTIME_VAD": "silero",
    "DUPLEX_SESSION__OVERLAP_POLICY": "barge_in_on_speech",
}


def _wav(name: str) -> tuple[bytes, float, float]:
    """PCM16 of a fixture, and where its speech starts and ends (ms)."""
    with wave.open(str(SPEECH / name)) as w:
        pcm = w.readframes(w.getnframes())
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.float32)) / 32768.0
    loud = np.flatnonzero(samples > 0.02)
    return pcm, loud[0] / 24.0, (loud[-1] + 1) / 24.0


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000.0, 1) if values else None


SILENCE_MS: int | None = None
"""The sessions' ``silence_duration_ms`` (``--silence-ms``; ``None``: the server's, 400 for
the agent)."""
SESSION: dict[str, Any] = {}
"""What the server opened the sessions with (``silence_duration_ms``)."""


class Talker:
    """One Realtime session with a microphone that always sends (speech or silence)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.queue: list[bytes] = []
        self.sent_at: list[float] = []  # send time of each frame

    async def read(self) -> None:
        async for text in self.ws:
            self.events.append((trio.current_time(), json.loads(text)))

    async def microphone(self) -> None:
        silence = bytes(FRAME_BYTES)
        start = trio.current_time()
        index = 0
        while True:
            frame = self.queue.pop(0) if self.queue else silence
            data = base64.b64encode(frame).decode()
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": data}))
            self.sent_at.append(trio.current_time())
            index += 1
            await trio.sleep_until(start + index * PERIOD)

    def say(self, pcm: bytes) -> float:
        """Queue ``pcm``; returns when its first frame will be sent (trio time)."""
        ahead = len(self.queue)
        frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
        frames[-1] = frames[-1].ljust(FRAME_BYTES, b"\0")
        self.queue.extend(frames)
        last = self.sent_at[-1] if self.sent_at else trio.current_time()
        return last + (ahead + 1) * PERIOD

    async def next(self, kind: str, after: float, timeout: float = 30.0) -> tuple[float, dict]:
        """The first event of ``kind`` that arrived at or after ``after``."""
        with trio.fail_after(timeout):
            while True:
                for at, event in self.events:
                    if at >= after and event["type"] == kind:
                        return at, event
                await trio.sleep(0.005)


@asynccontextmanager
async def talkers(url: str, count: int) -> AsyncIterator[list[Talker]]:
    """``count`` sessions, their readers and microphones running."""
    async with AsyncExitStack() as stack:
        sockets = [
            await stack.enter_async_context(connect(url, max_queue=None)) for _ in range(count)
        ]
        async with trio.open_nursery() as nursery:
            out = [Talker(ws) for ws in sockets]
            for talker in out:
                nursery.start_soon(talker.read)
                _, created = await talker.next("session.created", 0.0)
                detection = created["session"]["audio"]["input"]["turn_detection"]
                SESSION["silence_duration_ms"] = detection["silence_duration_ms"]
                if SILENCE_MS is not None:
                    detection = {"type": "server_vad", "silence_duration_ms": SILENCE_MS}
                    update = {"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
                    await talker.ws.send(json.dumps({"type": "session.update", "session": update}))
                    await talker.next("session.updated", 0.0)
                nursery.start_soon(talker.microphone)
            yield out
            nursery.cancel_scope.cancel()


async def _turn(talker: Talker, hello: tuple[bytes, float, float]) -> dict[str, float]:
    pcm, _, end_ms = hello
    first_frame = talker.say(pcm)
    spoken = first_frame + end_ms / 1000.0  # a live speaker finishes here
    stopped, _ = await talker.next("input_audio_buffer.speech_stopped", first_frame)
    audio, _ = await talker.next("response.output_audio.delta", first_frame)
    await talker.next("response.done", first_frame)
    return {"from_speech_end": audio - spoken, "from_speech_stopped": audio - stopped}


async def latency(url: str, turns: int) -> dict[str, Any]:
    hello = _wav("hello.wav")
    results = []
    async with talkers(url, 1) as (talker,):
        await trio.sleep(0.5)
        for _ in range(turns):
            results.append(await _turn(talker, hello))
            print(json.dumps({k: round(v * 1000) for k, v in results[-1].items()}), flush=True)
            await trio.sleep(0.5)
    ends = [r["from_speech_end"] for r in results]
    stops = [r["from_speech_stopped"] for r in results]
    return {
        "turns": len(results),
        "first_audio_from_speech_end_ms": {"p50": _pct(ends, 50), "p95": _pct(ends, 95)},
        "first_audio_from_speech_stopped_ms": {"p50": _pct(stops, 50), "p95": _pct(stops, 95)},
    }


async def barge_in(url: str, trials: int) -> dict[str, Any]:
    hello, (interrupt, onset_ms, _) = _wav("hello.wav"), _wav("interrupt.wav")
    last_audio, cancelled, statuses = [], [], []
    async with talkers(url, 1) as (talker,):
        await trio.sleep(0.5)
        for _ in range(trials):
            first_frame = talker.say(hello[0])
            _, delta = await talker.next("response.output_audio.delta", first_frame)
            response_id = delta["response_id"]
            await trio.sleep(0.3)  # the reply is playing
            onset = talker.say(interrupt) + onset_ms / 1000.0
            done_at, done = await talker.next("response.done", onset - 1.0)
            statuses.append(done["response"]["status"])
            audio = [
                at
                for at, e in talker.events
                if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
            ]
            last_audio.append(max(audio) - onset)
            cancelled.append(done_at - onset)
            await talker.next("response.done", done_at + 0.001)  # the answer to the interruption
            await trio.sleep(0.5)
    return {
        "trials": trials,
        "cancelled": statuses.count("cancelled"),
        "last_reply_audio_after_onset_ms": {
            "p50": _pct(last_audio, 50),
            "p95": _pct(last_audio, 95),
        },
        "cancel_after_onset_ms": {"p50": _pct(cancelled, 50), "p95": _pct(cancelled, 95)},
    }


async def capacity(url: str, counts: list[int], turns: int, seed: int) -> list[dict[str, Any]]:
    hello = _wav("hello.wav")
    rows = []
    for count in counts:
        rng = random.Random(seed + count)
        firsts: list[float] = []
        failures: list[int] = []

        async def one(
            talker: Talker, rng: random.Random, firsts: list[float], failures: list[int]
        ) -> None:
            await trio.sleep(rng.uniform(0, 3.0))
            for _ in range(turns):
                try:
                    firsts.append((await _turn(talker, hello))["from_speech_end"])
                except trio.TooSlowError:
                    failures.append(1)
                await trio.sleep(rng.uniform(0.2, 2.0))

        async with talkers(url, count) as opened, trio.open_nursery() as nursery:
            for talker in opened:
                nursery.start_soon(one, talker, rng, firsts, failures)
        row = {
            "sessions": count,
            "turns": len(firsts),
            "timeouts": len(failures),
            "first_audio_p50_ms": _pct(firsts, 50),
            "first_audio_p95_ms": _pct(firsts, 95),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
        if failures or (row["first_audio_p95_ms"] or 0) > 1000.0:
            break
    return rows


async def main(args: argparse.Namespace, serve_args: list[str]) -> None:
    out = Path(args.out)
    async with serve(serve_args, env=AGENT_ENV, log=out.with_suffix(".log")) as served:
        url = served.ws("/v1/realtime")
        report: dict[str, Any] = {
            "bench": "agent",
            "machine": machine(),
            "commit": commit(),
            "serve_args": serve_args,
        }
        report["latency"] = await latency(url, args.turns)
        report["silence_duration_ms"] = SILENCE_MS or SESSION.get("silence_duration_ms")
        print(json.dumps(report["latency"]), flush=True)
        report["barge_in"] = await barge_in(url, args.barge_ins)
        print(json.dumps(report["barge_in"]), flush=True)
        counts = [int(n) for n in args.sessions.split(",")]
        report["capacity"] = await capacity(url, counts, args.capacity_turns, args.seed)
        held = [
            r["sessions"] for r in report["capacity"] if (r["first_audio_p95_ms"] or 1e9) < 1000
        ]
        report["sessions_held_under_1s_p95"] = max(held, default=0)
    write_report(out.with_suffix(".json"), report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--barge-ins", type=int, default=10)
    parser.add_argument("--sessions", default="1,2,4,8,12,16")
    parser.add_argument("--capacity-turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--silence-ms", type=int, help="the sessions' silence_duration_ms")
    parser.add_argument("--out", default="bench/results/agent")
    parser.add_argument("--asr", help="the agent's ASR (duplex serve --asr): a Whisper folder")
    parsed = parser.parse_args(argv)
    if parsed.asr:
        rest += ["--asr", parsed.asr]
    SILENCE_MS = parsed.silence_ms
    trio.run(main, parsed, rest)
