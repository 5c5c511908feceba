"""Abrupt disconnects mid-response, each resumed: is any event lost or duplicated?

    .venv/bin/python bench/disconnects.py [--disconnects 1000] [--clients 8] [--seed 0]
        [--out bench/results/disconnects] [-- duplex serve ARGS]

Starts ``duplex serve`` (loopback model, ``overlap_policy = model``: it echoes each
spoken tone as one response) and runs ``--clients`` sessions on ``/v1/duplex`` at once.
Each repeats: speak a tone of 4 to 20 frames (80 ms each) and 8 frames of silence, ahead
of real time, then a ``session.update`` whose answer shows the session has all of it;
then, at a random point (after 0 to all of the response's audio deltas have arrived,
plus a random 0-80 ms), the socket is **aborted**: a TCP reset, no close frame. A new
socket sends ``session.resume`` with the last ``server_event_seq`` received, and reads
until the response is done. Every ``--disconnects`` drop is one such cycle.

Counted, per session, over all its sockets:

- **lost**: a journaled ``server_event_seq`` never received (a gap in 1..last);
- **duplicated**: a seq received twice (a replay of one already acknowledged by the
  resume's cursor, or twice on one socket);
- **audio**: bytes of each response's audio received (each seq once) against the tone
  spoken: the loopback's answer is exactly it, so any difference is loss or duplication;
- **resume refused**, responses that did not complete, and, after every session is
  closed, sessions or engine slots still held (``/health``, ``duplex_engine_live_slots``).

A cycle that takes over 60 s (a machine too busy) gives its session up: the client
opens a new session, counted as its own record (its seqs start at 1 again), and the
given-up session's unfinished response is counted as **abandoned**, not compared. A
session the server refuses to open (admission) is retried and costs no cycle.

Writes ``OUT.json``.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import trio
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.trio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import (
    FRAME,
    append,
    commit,
    log_problems,
    machine,
    serve,
    settle,
    silence,
    tone,
    write_report,
)


class Session:
    """One session's record over all its sockets."""

    def __init__(self, index: int, serial: int) -> None:
        self.index = index
        self.serial = serial  # a client that had to open a new session gets a new record
        self.created: dict[str, Any] | None = None
        self.token = ""
        self.seqs: Counter[int] = Counter()  # every journaled seq received, with repeats
        self.audio: dict[str, dict[int, int]] = {}  # response id -> seq -> audio bytes
        self.cursor = 0  # the highest seq such that every seq up to it was received
        self.drops = 0  # sockets of this session dropped mid-response

    def take(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq")
        if not seq:
            return
        self.seqs[seq] += 1
        while self.seqs[self.cursor + 1]:
            self.cursor += 1
        if event["type"] == "response.audio.delta":
            per = self.audio.setdefault(event["response_id"], {})
            per[seq] = len(base64.b64decode(event["delta"]))


class Run:
    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url
        self.args = args
        self.left = args.disconnects
        self.counts: Counter[str] = Counter()
        self.examples: list[str] = []
        self.sessions: list[Session] = []
        self.spoken: dict[tuple[int, str], int] = {}  # (session serial, response id) -> bytes

    def note(self, what: str, detail: str) -> None:
        self.counts[what] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{what}: {detail}")

    def new_session(self, index: int) -> Session:
        session = Session(index, len(self.sessions))
        self.sessions.append(session)
        return session

    async def client(self, index: int) -> None:
        rng = random.Random(f"{self.args.seed}-{index}")
        session = self.new_session(index)
        while self.left > 0:
            if session.created is None and session.seqs:  # that session was given up
                session = self.new_session(index)  # its seqs start at 1 again: its own record
            self.left -= 1
            current, before = session, session.drops
            try:
                with trio.fail_after(60):
                    await self.cycle(session, rng)
            except (trio.TooSlowError, ConnectionClosed):
                self.note("cycle_timeout", f"session {index}")
                session.created = None  # start over with a new session
            if current.drops == before:  # refused or timed out before its drop: not counted
                self.left += 1
        if session.created is not None:
            await self.close(session)

    @asynccontextmanager
    async def socket(self) -> AsyncIterator[Any]:
        """A new socket (retried while the machine refuses handshakes)."""
        for _ in range(50):
            opening = connect(self.url, max_queue=None, max_size=None, open_timeout=30)
            try:
                ws = await opening.__aenter__()
                break
            except (OSError, InvalidHandshake, TimeoutError):
                self.counts["connect_retry"] += 1
                await trio.sleep(0.5)
        else:
            raise RuntimeError("cannot connect")
        try:
            yield ws
        finally:
            # an aborted socket's reader fails: expected
            with trio.move_on_after(2), suppress(Exception):
                await opening.__aexit__(None, None, None)

    async def cycle(self, session: Session, rng: random.Random) -> None:
        frames = rng.randint(4, 20)
        spoken = tone(frames, amplitude=rng.uniform(0.1, 0.6), start=rng.randrange(100))
        async with self.socket() as ws:
            if session.created is None:
                await ws.send(json.dumps({"type": "session.create", "session": {}}))
                created = json.loads(await ws.recv())
                if created["type"] != "session.created":
                    self.note("refused", json.dumps(created)[:200])
                    await trio.sleep(1)
                    return
                session.created = created
                session.token = created["resume_token"]
            else:
                if not await self.resume(ws, session):
                    return
            marker = rng.randrange(10**9)
            pcm = spoken + silence(8)
            for i in range(0, len(pcm), 2 * FRAME):
                await ws.send(append(pcm[i : i + 2 * FRAME]))
            await ws.send(json.dumps({"type": "session.update", "event_id": f"m{marker}",
                                      "session": {}}))  # fmt: skip
            # every input taken; the response is coming: drop at a random point of it
            drop_after = rng.randint(0, frames)
            deltas = 0
            response = None
            while True:
                event = json.loads(await ws.recv())
                session.take(event)
                if event["type"] == "response.created":
                    response = event["response"]["id"]
                    self.spoken[(session.serial, response)] = len(spoken)
                if event["type"] == "response.audio.delta" and event["response_id"] == response:
                    deltas += 1
                if (response is not None and deltas >= drop_after) or (
                    event["type"] == "response.done" and event["response"]["id"] == response
                ):
                    break
            if response is None:
                self.note("no_response", f"session {session.index}")
            await trio.sleep(rng.uniform(0, 0.08))
            # a few events may have arrived meanwhile: unread, they are lost with the socket
            abort(ws)
        self.counts["disconnects"] += 1
        session.drops += 1
        # resume, read until this response is done
        async with self.socket() as ws:
            if not await self.resume(ws, session):
                return
            if response is None:
                return
            with trio.fail_after(30):
                while not any(
                    r == response for r in self.done_of(session)
                ):  # replayed, or still coming
                    event = json.loads(await ws.recv())
                    session.take(event)
                    if event["type"] == "response.done":
                        self.dones.setdefault(session.index, []).append(
                            (event["response"]["id"], event["response"]["status"])
                        )
            await ws.send(json.dumps({"type": "session.event_ack",
                                      "server_event_seq": session.cursor}))  # fmt: skip

    dones: dict[int, list[tuple[str, str]]] = {}

    def done_of(self, session: Session) -> list[str]:
        return [r for r, _ in self.dones.get(session.index, [])]

    async def resume(self, ws: Any, session: Session) -> bool:
        assert session.created is not None
        await ws.send(
            json.dumps(
                {
                    "type": "session.resume",
                    "session_id": session.created["session"]["id"],
                    "resume_token": session.token,
                    "last_received_server_event_seq": session.cursor,
                }
            )
        )
        resumed = json.loads(await ws.recv())
        if resumed["type"] != "session.resumed":
            self.note("resume_refused", json.dumps(resumed)[:300])
            session.created = None
            return False
        session.token = resumed["resume_token"]
        self.counts["resumed"] += 1
        return True

    async def close(self, session: Session) -> None:
        async with self.socket() as ws:
            if await self.resume(ws, session):
                await ws.send(json.dumps({"type": "session.close"}))
                with trio.move_on_after(10):
                    while True:
                        event = json.loads(await ws.recv())
                        session.take(event)
                        if event["type"] == "response.done":
                            self.dones.setdefault(session.index, []).append(
                                (event["response"]["id"], event["response"]["status"])
                            )
                        if event["type"] == "session.closed":
                            break


def abort(ws: Any) -> None:
    """Drop the socket with a TCP reset: no close frame, no FIN handshake."""
    sock = ws.stream.socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def verdict(run: Run) -> dict[str, Any]:
    lost = duplicated = 0
    audio_mismatch: list[str] = []
    responses = 0
    done = {response for d in run.dones.values() for response, _ in d}
    abandoned = 0
    for session in run.sessions:  # one record per session id (a client may open several)
        last = max(session.seqs, default=0)
        lost += sum(1 for seq in range(1, last + 1) if not session.seqs[seq])
        duplicated += sum(n - 1 for n in session.seqs.values() if n > 1)
        for (serial, response), spoken in run.spoken.items():
            if serial != session.serial:
                continue
            if response not in done:  # its session was given up (a cycle timed out)
                abandoned += 1
                continue
            responses += 1
            heard = sum(session.audio.get(response, {}).values())
            if heard != spoken:
                audio_mismatch.append(
                    f"session {session.index} {response}: heard {heard} of {spoken}"
                )
    statuses = Counter(s for d in run.dones.values() for _, s in d)
    return {
        "lost_events": lost,
        "duplicated_events": duplicated,
        "responses": responses,
        "responses_abandoned": abandoned,
        "sessions": len(run.sessions),
        "audio_mismatches": len(audio_mismatch),
        "audio_mismatch_examples": audio_mismatch[:5],
        "response_statuses": dict(statuses),
        "events_received": sum(sum(s.seqs.values()) for s in run.sessions),
    }


async def disconnects(args: argparse.Namespace) -> dict[str, Any]:
    code = commit()  # the code that runs: taken at the start
    out = Path(args.out)
    started = time.monotonic()
    async with serve(args.serve_args, log=out.with_suffix(".log")) as served:
        run = Run(served.ws("/v1/duplex"), args)
        async with trio.open_nursery() as nursery:
            for index in range(args.clients):
                nursery.start_soon(run.client, index)
        left = await settle(served.http, timeout_s=60)
        alive = served.process.poll() is None
    return {
        "command": " ".join(["bench/disconnects.py", *sys.argv[1:]]),
        "machine": machine(),
        "commit": code,
        "serve_args": args.serve_args,
        "seconds": round(time.monotonic() - started, 1),
        "clients": args.clients,
        **verdict(run),
        "counts": dict(run.counts),
        "examples": run.examples,
        "left_after_settle": left,
        "server_alive_at_end": alive,
        "server_log": log_problems(served.log_lines()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disconnects", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", default="0")
    parser.add_argument("--out", default="bench/results/disconnects")
    parser.add_argument("serve_args", nargs="*", help="after --: duplex serve arguments")
    args = parser.parse_args()
    report = trio.run(disconnects, args)
    write_report(Path(args.out).with_suffix(".json"), report)
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
