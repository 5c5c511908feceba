"""Faults mid-session on a real ``duplex serve``: engine crashes and killed child processes.

    .venv/bin/python bench/faults.py [--crashes 100] [--kills 20] [--clients 4]
        [--phases engine-crash,engine-process,stall,worker,shard,asr]
        [--stall-timeout-s 5] [--out bench/results/faults]

Each phase starts its own server (loopback model) and ``--clients`` sessions on
``/v1/duplex``; in every round half of them are mid-response (a long tone sent ahead of
real time, the echo under way) and half idle, then one fault is injected:

- ``engine-crash`` (``--crashes`` rounds): an engine step raises (``bench/_faulty_serve.py``:
  the loopback model with a fault file), in-process engine. Rounds are 2 s apart at
  least (the root supervisor allows 3 restarts in 5 s; more ends the process, by design).
- ``engine-process`` (``--kills``): SIGKILL of the engine process (``--engine-process on``).
- ``stall`` (``--kills``): SIGSTOP of the engine process (``--engine-process on``): alive,
  but no tick ends. The server's engine watchdog must kill it after
  ``--stall-timeout-s`` (``server.engine_stall_timeout_s``) and the crash path take over;
  each client is told as in ``engine-process``, and the stopped process must be gone
  (**stopped left** otherwise). The report gives how long after the SIGSTOP the clients
  were told (``told_s``).
- ``worker`` (``--kills``): SIGKILL of one of two connection workers
  (``--connection-workers 2``): its sockets close, their sessions wait for a resume.
- ``shard`` (``--kills``): SIGKILL of the session shard (``--connection-workers 1
  --session-shards 2``): its sockets close (1011), its sessions are gone.
- ``asr`` (``--kills``): SIGKILL of the voice agent's ASR child process (pocketsphinx, a
  child of the engine process: ``--engine-process on``) while ``--clients`` Realtime
  sessions speak a turn (``tests/fixtures/speech/hello.wav``, a JSGF grammar so that what
  is heard is deterministic). Each turn must end (its transcription ``completed``, empty
  or partial where the kill cost its audio, or ``failed``; **hung** otherwise), and the
  next turn of every session must be heard exactly and answered with audio (**not
  recovered** otherwise).

With engine processes the request-batched models (TTS, ASR, robot policy) run in the
engine process too: in the ``engine-process`` and ``stall`` phases a speech request
(``POST /v1/audio/speech``) is in flight when the engine process is killed; its answer
must be audio or a typed error (**untyped** otherwise: a 500 or a hang), and after the
round a speech request must be answered with audio again (**speech not recovered**).

After each fault every client must, within ``--bound-s`` (15 s), be **told**: an engine
fault sends each session an ``error`` ``engine_error`` (an open response ends ``failed``);
a killed worker or shard closes the sockets it held. A socket that was neither told nor
closed and then does not echo a tone within the bound is **hung**; a session told of an
engine fault that never got it is **not told**. Then each client is made whole again
(a closed socket resumes its session, or opens a new one where the session is gone)
and every live session must echo a tone: **not recovered** otherwise.

After the last round every session is closed and the server must settle with no live
session and no engine slot held (``/health`` ``sessions.live`` and the
``duplex_engine_live_slots`` gauge); whatever remains is **leaked**. While sessions are
live, after each round the engine's live slots must equal ``/health``'s live sessions.
The server log is scanned for tracebacks other than the injected faults'. Writes OUT.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.trio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import (
    FRAME,
    Served,
    append,
    children,
    commit,
    get_json,
    machine,
    metric_sum,
    metrics,
    serve,
    settle,
    silence,
    tone,
    write_report,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.agent.agentkit import GRAMMAR, HELLO, RealtimeSocket, wav_pcm16  # noqa: E402
from tests.agent.agentkit import silence as silence_ms  # noqa: E402


class Watched:
    """One client socket with a reader that records everything, and its session."""

    def __init__(self, url: str, index: int) -> None:
        self.url = url
        self.index = index
        self.events: list[dict[str, Any]] = []
        self.closed = trio.Event()
        self.close_code: int | None = None
        self.ws: Any = None
        self.created: dict[str, Any] | None = None
        self.cursor = 0
        self.cancel = trio.CancelScope()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the socket, read until it closes."""
        with self.cancel:
            try:
                async with connect(self.url, max_queue=None, max_size=None,
                                   open_timeout=30) as ws:  # fmt: skip
                    self.ws = ws
                    task_status.started()
                    while True:
                        event = json.loads(await ws.recv())
                        seq = event.get("server_event_seq")
                        if seq:
                            self.cursor = max(self.cursor, seq)
                        self.events.append(event)
            except ConnectionClosed as exc:
                self.close_code = exc.rcvd.code if exc.rcvd is not None else None
            except (OSError, InvalidHandshake, TimeoutError):  # no handshake: the caller retries
                self.close_code = -1
            finally:
                self.closed.set()

    async def send(self, event: dict[str, Any] | str) -> bool:
        try:
            await self.ws.send(event if isinstance(event, str) else json.dumps(event))
        except (ConnectionClosed, AttributeError):
            return False
        return True

    async def wait(self, since: int, kind: str, timeout: float, **match: Any) -> dict | None:
        """The first event of ``kind`` at or after index ``since`` whose fields (dotted
        paths) contain the given values (None: closed or timeout)."""

        def wanted(event: dict[str, Any]) -> bool:
            return event["type"] == kind and all(v in str(_get(event, k)) for k, v in match.items())

        with trio.move_on_after(timeout):
            while True:
                for event in self.events[since:]:
                    if wanted(event):
                        return event
                if self.closed.is_set():
                    return None
                await trio.sleep(0.02)
        return None


def _get(event: dict[str, Any], path: str) -> Any:
    value: Any = event
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


async def open_watched(nursery: trio.Nursery, url: str, index: int) -> Watched:
    c = Watched(url, index)
    await nursery.start(c.run)
    return c


async def create(c: Watched, timeout: float) -> bool:
    start = len(c.events)
    await c.send({"type": "session.create", "session": {}})
    created = await c.wait(start, "session.created", timeout)
    if created is None:
        return False
    c.created = created
    await c.send({"type": "session.update", "session": {}})  # a client event: resumable
    return await c.wait(start, "session.updated", timeout) is not None


async def resume(c: Watched, old: Watched, timeout: float) -> bool:
    assert old.created is not None
    start = len(c.events)
    await c.send(
        {
            "type": "session.resume",
            "session_id": old.created["session"]["id"],
            "resume_token": old.created["resume_token"],
            "last_received_server_event_seq": old.cursor,
        }
    )
    resumed = await c.wait(start, "session.resumed", timeout)
    if resumed is None:
        return False
    c.created = {**old.created, "resume_token": resumed["resume_token"]}
    c.cursor = max(c.cursor, old.cursor)
    return True


async def quiet(c: Watched, timeout: float, before: list[dict[str, Any]] = ()) -> None:
    """Until no response of the session is open (``before``: what an earlier socket of
    the same session got): a tone spoken over an open response would extend it."""
    with trio.move_on_after(timeout):
        while not c.closed.is_set():
            events = [*before, *c.events]
            created = {e["response"]["id"] for e in events if e["type"] == "response.created"}
            done = {e["response"]["id"] for e in events if e["type"] == "response.done"}
            if created <= done:
                return
            await trio.sleep(0.05)


async def echo(
    c: Watched, timeout: float, amplitude: float = 0.3, before: list[dict[str, Any]] = ()
) -> bool:
    """The loopback answers a spoken tone with exactly it (once the session is quiet)."""
    await quiet(c, timeout, before)
    start = len(c.events)
    spoken = tone(6, amplitude=amplitude)
    pcm = spoken + silence(8)
    for i in range(0, len(pcm), 2 * FRAME):
        if not await c.send(append(pcm[i : i + 2 * FRAME])):
            return False
    deadline = trio.current_time() + timeout
    seen = start
    while True:  # a response still open before (or replayed by a resume) may end first
        done = await c.wait(seen, "response.done", deadline - trio.current_time())
        if done is None:
            return False
        seen = c.events.index(done, seen) + 1
        heard = b"".join(
            base64.b64decode(e["delta"])
            for e in c.events[start:]
            if e["type"] == "response.audio.delta"
            and e.get("response_id") == done["response"]["id"]
        )
        if heard == spoken and done["response"]["status"] == "completed":
            return True
        # the echo split over responses (a late frame after a restart ends one: the
        # loopback answers what it hears, frame by frame): all of it, each in order
        since = c.events[start:seen]
        opened = [e["response"]["id"] for e in since if e["type"] == "response.created"]
        ended = {e["response"]["id"]: e["response"]["status"] for e in since
                 if e["type"] == "response.done"}  # fmt: skip
        heard = b"".join(
            base64.b64decode(e["delta"]) for e in since
            if e["type"] == "response.audio.delta" and e.get("response_id") in opened
        )  # fmt: skip
        if (heard == spoken and len(opened) > 1
                and all(ended.get(r) == "completed" for r in opened)):  # fmt: skip
            SPLIT_ECHOES[0] += 1
            return True


class SpeechCall:
    """One ``POST /v1/audio/speech`` (a long enough text to be in flight for a while):
    ``answer`` is ``audio``, a typed error's ``status:code``, or counted untyped."""

    TEXT = "The engine process is about to be killed while this sentence is spoken. " * 4

    def __init__(self, http: str, phase: Phase) -> None:
        self.http = http
        self.phase = phase
        self.sent = trio.Event()
        self.done = trio.Event()
        self.answer = ""

    async def run(self) -> None:
        body = {"model": "tts-1", "input": self.TEXT, "voice": "alloy", "response_format": "pcm"}
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                self.sent.set()
                reply = await client.post(self.http + "/v1/audio/speech", json=body)
            if reply.status_code == 200 and len(reply.content) > 1000:
                self.answer = "audio"
            else:
                try:
                    self.answer = f"{reply.status_code}:{reply.json()['error']['code']}"
                except (ValueError, KeyError, TypeError):
                    self.answer = f"untyped {reply.status_code} {reply.text[:100]!r}"
                if reply.status_code >= 500 and reply.status_code != 503:
                    self.answer = f"untyped {self.answer}"
        except httpx.TransportError as exc:
            self.answer = f"untyped {exc!r}"
        finally:
            self.sent.set()
            self.done.set()
        self.phase.counts[f"speech_{self.answer.split(' ')[0]}"] += 1
        if self.answer.startswith("untyped"):
            self.phase.note("speech_untyped", self.answer[:200])


class AsrRounds:
    """The ``asr`` phase: Realtime sessions speak turns while the ASR child is killed."""

    def __init__(self, phase: Phase, served: Served) -> None:
        self.phase = phase
        self.served = served
        self.args = phase.args
        self.hello = wav_pcm16("hello.wav")

    def asr_pid(self) -> int | None:
        """The ASR child: a multiprocessing child of the engine process (or the server)."""
        for parent in [*self.served.child_pids("engine"), self.served.pid]:
            for pid in children(parent):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"spawn_main" in f.read():
                            return pid
                except OSError:
                    continue
        return None

    async def turn(self, sock: RealtimeSocket) -> tuple[int, int]:
        """Speak hello.wav and a pause in real time; returns the event index before it."""
        start = len(sock.events)
        await sock.stream(self.hello + silence_ms(1200))
        return start, len(sock.events)

    async def ended(self, sock: RealtimeSocket, after: int) -> dict[str, Any] | None:
        """The turn's transcription end (completed or failed), None if none came."""
        kinds = ("conversation.item.input_audio_transcription.completed",
                 "conversation.item.input_audio_transcription.failed")  # fmt: skip
        with trio.move_on_after(self.args.bound_s):
            while True:
                for event in sock.events[after:]:
                    if event["type"] in kinds:
                        return event
                await trio.sleep(0.05)
        return None

    async def answered(self, sock: RealtimeSocket, after: int) -> dict[str, Any] | None:
        with trio.move_on_after(self.args.bound_s + 30):
            while True:
                for event in sock.events[after:]:
                    if event["type"] == "response.done":
                        return event
                await trio.sleep(0.05)
        return None

    async def run(self) -> None:
        phase, args = self.phase, self.args
        url = self.served.ws("/v1/realtime")
        async with trio.open_nursery() as nursery:
            socks = []
            for _ in range(args.clients):
                ws = await nursery.start(_hold, url)
                sock = RealtimeSocket(ws)
                nursery.start_soon(sock.pump)
                await sock.until("session.created")
                await sock.send(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "audio": {"input": {"transcription": {"model": "whisper-1"}}},
                        },
                    }
                )
                await sock.until("session.updated")
                socks.append(sock)
            for round_ in range(phase.rounds):
                await self.round(socks, round_)
            nursery.cancel_scope.cancel()

    async def round(self, socks: list[RealtimeSocket], round_: int) -> None:
        phase = self.phase
        before = self.asr_pid()
        if before is None:
            phase.note("no_asr_child", f"round {round_}")
            return
        marks = [len(s.events) for s in socks]
        async with trio.open_nursery() as speaking:
            for sock in socks:
                speaking.start_soon(self.turn, sock)
            # mid-turn: after the speech started, while its audio is heard
            await socks[0].until("input_audio_buffer.speech_started", after=marks[0])
            await trio.sleep(phase.rng.uniform(0.0, 2.5))
            os.kill(before, signal.SIGKILL)
            phase.counts["faults"] += 1
        for i, sock in enumerate(socks):
            end = await self.ended(sock, marks[i])
            if end is None:
                phase.note("hung", f"round {round_} client {i}: {summary(sock.events[marks[i] :])}")
            else:
                heard = end.get("transcript")
                phase.counts["heard_whole" if heard == HELLO else
                             "heard_partial_or_none" if end["type"].endswith("completed")
                             else "transcription_failed"] += 1  # fmt: skip
            await self.answered(sock, marks[i])  # the turn's reply (if any) ends first
        # the next turn of every session is heard exactly, and answered with audio
        marks = [len(s.events) for s in socks]
        async with trio.open_nursery() as speaking:
            for sock in socks:
                speaking.start_soon(self.turn, sock)
        for i, sock in enumerate(socks):
            end = await self.ended(sock, marks[i])
            done = await self.answered(sock, marks[i])
            audio = sum(len(e["delta"]) for e in sock.events[marks[i]:]
                        if e["type"] == "response.output_audio.delta")  # fmt: skip
            if (end is None or end.get("transcript") != HELLO or done is None
                    or done["response"]["status"] != "completed" or audio < 10_000):  # fmt: skip
                phase.note("not_recovered", f"round {round_} client {i}: "
                           f"{summary(sock.events[marks[i]:])}")  # fmt: skip
        after = self.asr_pid()
        if after is None or after == before:
            phase.note("asr_not_replaced", f"round {round_}: {before} -> {after}")
        else:
            phase.counts["asr_replaced"] += 1


async def _hold(url: str, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    async with connect(url, max_queue=None, max_size=None) as ws:
        task_status.started(ws)
        await trio.sleep_forever()


def _stopped(pid: int) -> bool:
    """``pid`` exists and is stopped (state ``T``), not a zombie or gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _spread(values: list[float]) -> dict[str, float] | None:
    """Median and max of ``values``, rounded (None: none)."""
    if not values:
        return None
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 2), "max": round(ordered[-1], 2)}


SPLIT_ECHOES = [0]
"""Echoes heard whole but over two or more responses (counted, not a failure)."""


def summary(events: list[dict[str, Any]]) -> str:
    """What a socket got since the fault, for a report: event types in order (audio deltas
    counted per response), each response's end."""
    out: list[str] = []
    for e in events:
        kind = e["type"]
        if kind == "response.audio.delta":
            kind = "delta"
            if out and out[-1].startswith("delta"):
                n = int(out[-1].split("x")[1]) if "x" in out[-1] else 1
                out[-1] = f"deltax{n + 1}"
                continue
        elif kind == "response.done":
            kind = f"done:{e['response']['status']}"
        elif kind == "error":
            kind = f"error:{e['error']['code']}"
        out.append(kind)
    return " ".join(out)[-600:]


class Phase:
    """One kind of fault, its server, its clients and its counts."""

    def __init__(self, name: str, rounds: int, args: argparse.Namespace) -> None:
        self.name = name
        self.rounds = rounds
        self.args = args
        self.rng = random.Random(f"{args.seed}-{name}")
        self.counts: Counter[str] = Counter()
        self.examples: list[str] = []
        self.slot_mismatches: list[str] = []
        self.told_s: list[float] = []
        """Seconds from each engine fault to each client's ``engine_error`` (an upper bound:
        the clients are checked one after the other)."""
        self.fault_file = Path(args.out).with_suffix(f".{name}.fault")

    def serve_args(self) -> tuple[list[str], dict[str, str], list[str]]:
        if self.name == "engine-crash":
            return ["--model", "faulty-loopback"], {"FAULT_FILE": str(self.fault_file)}, [
                str(HERE / "_faulty_serve.py")
            ]  # fmt: skip
        if self.name == "engine-process":
            return ["--engine-process", "on"], {}, []
        if self.name == "stall":
            timeout = {"DUPLEX_ENGINE_STALL_TIMEOUT_S": str(self.args.stall_timeout_s)}
            return ["--engine-process", "on"], timeout, []
        if self.name == "asr":
            grammar = Path(tempfile.mkdtemp(prefix="duplex-faults-")) / "fixtures.gram"
            grammar.write_text(GRAMMAR)  # (not next to the results: nothing to commit)
            return ["--engine-process", "on"], {"DUPLEX_AGENT_ASR_GRAMMAR": str(grammar)}, []
        if self.name == "worker":
            return ["--connection-workers", "2"], {}, []
        return ["--connection-workers", "1", "--session-shards", "2"], {}, []

    def note(self, what: str, detail: str) -> None:
        self.counts[what] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{what}: {detail}")

    async def inject(self, served: Served) -> int | None:
        """One fault; returns the killed pid (None for an engine crash)."""
        if self.name == "engine-crash":
            self.fault_file.touch()
            return None
        kind = {"engine-process": "engine", "stall": "engine", "worker": "worker",
                "shard": "shard"}[self.name]  # fmt: skip
        await self.whole(served)
        pids = served.child_pids(kind)
        pid = self.rng.choice(pids)
        os.kill(pid, signal.SIGSTOP if self.name == "stall" else signal.SIGKILL)
        return pid

    async def balance(
        self, served: Served, nursery: trio.Nursery, clients: list[Watched]
    ) -> list[Watched]:
        """Sessions on both shards (ids name their shard): a new session goes to the
        roomiest shard, so sessions of shard 0 are closed and opened again until half are
        on shard 1, the one that is killed."""
        await self.whole(served)
        clients = list(clients)
        for _ in range(4 * len(clients)):
            on_1 = [c for c in clients if c.created and "-s1-" in c.created["session"]["id"]]
            if len(on_1) >= len(clients) // 2:
                break
            i = next(i for i, c in enumerate(clients) if c not in on_1)
            await clients[i].send({"type": "session.close"})
            await clients[i].wait(0, "session.closed", self.args.bound_s)
            clients[i].cancel.cancel()
            c = await open_watched(nursery, served.ws("/v1/duplex"), i)
            if not await create(c, self.args.bound_s):
                raise RuntimeError("shard phase: no session")
            clients[i] = c
        self.counts["placed_on_killed_shard"] += sum(
            "-s1-" in c.created["session"]["id"] for c in clients if c.created
        )
        return clients

    async def whole(self, served: Served) -> None:
        """Until every child serves again: a child killed before it ever served stops the
        server (docs/operations.md), so the next kill waits for the last one's replacement."""
        with trio.fail_after(90):
            while True:
                status, health = await get_json(served.http, "/health")
                text = await metrics(served.http)
                if self.name == "worker":
                    ok = metric_sum(text, "duplex_connection_workers_serving") == 2
                else:
                    ok = status == 200 and health["status"] == "ok"
                if ok:
                    return
                await trio.sleep(0.2)

    async def run(self) -> dict[str, Any]:
        args = self.args
        serve_args, env, wrapper = self.serve_args()
        log = Path(args.out).with_suffix(f".{self.name}.log")
        started = time.monotonic()
        if self.name == "asr":
            async with serve(serve_args, env=env, log=log, wrapper=wrapper) as served:
                await AsrRounds(self, served).run()
                left = await settle(served.http, timeout_s=60)
                _, health = await get_json(served.http, "/health")
                text = await metrics(served.http)
                alive = served.process.poll() is None
            return self.report(served, started, left, health, text, alive)
        async with serve(serve_args, env=env, log=log, wrapper=wrapper) as served, \
                trio.open_nursery() as nursery:  # fmt: skip
            url = served.ws("/v1/duplex")
            clients = [await open_watched(nursery, url, i) for i in range(args.clients)]
            for c in clients:
                if not await create(c, args.bound_s):
                    raise RuntimeError(f"{self.name}: could not open session {c.index}")
            last_fault = -10.0
            for round_ in range(self.rounds):
                clients = await self.one_round(served, nursery, clients, round_, last_fault)
                last_fault = time.monotonic()
            for c in clients:
                await c.send({"type": "session.close"})
                await c.wait(0, "session.closed", args.bound_s)
            left = await settle(served.http, timeout_s=60)
            for c in clients:
                c.cancel.cancel()
            _, health = await get_json(served.http, "/health")
            text = await metrics(served.http)
            alive = served.process.poll() is None
            nursery.cancel_scope.cancel()
        return self.report(served, started, left, health, text, alive)

    def report(self, served: Served, started: float, left: dict[str, float],
               health: dict[str, Any], text: str, alive: bool) -> dict[str, Any]:  # fmt: skip
        args = self.args
        tracebacks = [
            line[:300]
            for line in served.log_lines()
            if ("Traceback" in line or '"exception"' in line)
            and "injected engine fault" not in line
            and '"event": "asr failed"' not in line  # a turn's chunk lost with the ASR child
        ]
        return {
            "rounds": self.rounds,
            "clients": args.clients,
            "seconds": round(time.monotonic() - started, 1),
            "hung_sockets": self.counts["hung"],
            "not_told": self.counts["not_told"],
            "not_recovered": self.counts["not_recovered"],
            "stopped_left": self.counts["stopped_left"],
            "told_s": _spread(self.told_s),
            "untyped_speech_answers": self.counts["speech_untyped"],
            "speech_not_recovered": self.counts["speech_not_recovered"],
            "leaked_after_settle": left,
            "slot_mismatches_during": len(self.slot_mismatches),
            "server_alive_at_end": alive,
            "engine_starts": health.get("engine_starts"),
            "restarts_counted": {
                name: metric_sum(text, name)
                for name in (
                    "duplex_actor_restarts_total",
                    "duplex_engine_process_restarts_total",
                    "duplex_engine_stall_kills_total",
                    "duplex_connection_worker_restarts_total",
                    "duplex_session_shard_restarts_total",
                )
            },
            "counts": dict(self.counts),
            "echoes_split_over_responses": SPLIT_ECHOES[0],
            "examples": self.examples,
            "slot_mismatch_examples": self.slot_mismatches[:5],
            "unexpected_tracebacks": len(tracebacks),
            "traceback_examples": tracebacks[:3],
        }

    async def one_round(
        self, served: Served, nursery: trio.Nursery, clients: list[Watched], round_: int,
        last_fault: float,
    ) -> list[Watched]:  # fmt: skip
        args = self.args
        if self.name == "engine-crash":  # the supervisor's limit: 3 restarts within 5 s
            await trio.sleep(max(0.0, last_fault + 2.0 - time.monotonic()))
        if self.name == "shard":
            clients = await self.balance(served, nursery, clients)
        speaking = set(self.rng.sample(range(len(clients)), len(clients) // 2))
        marks = [len(c.events) for c in clients]
        for i in speaking:
            pcm = tone(30, amplitude=0.2 + 0.02 * (round_ % 10))
            for k in range(0, len(pcm), 2 * FRAME):
                await clients[i].send(append(pcm[k : k + 2 * FRAME]))
        for i in speaking:  # mid-response when the fault comes
            await clients[i].wait(marks[i], "response.audio.delta", args.bound_s)
        marks = [len(c.events) for c in clients]
        speech = None
        if self.name in ("engine-process", "stall"):  # the TTS runs there: one in flight
            await self.whole(served)
            speech = SpeechCall(served.http, self)
            nursery.start_soon(speech.run)
            await speech.sent.wait()
        killed = await self.inject(served)
        fault_at = time.monotonic()
        self.counts["faults"] += 1
        engine_fault = self.name in ("engine-crash", "engine-process", "stall")
        bound_s = args.bound_s + (args.stall_timeout_s if self.name == "stall" else 0.0)
        told: list[bool] = []
        for i, c in enumerate(clients):
            got = await c.wait(marks[i], "error", bound_s, **{"error.code": "engine_error"}) \
                if engine_fault else None  # fmt: skip
            told.append(got is not None or c.closed.is_set())
            if got is not None:
                self.told_s.append(time.monotonic() - fault_at)
            if engine_fault and got is None and not c.closed.is_set():
                self.note("not_told", f"round {round_} client {i}")
        # the watchdog's SIGKILL ends a stopped process too
        if self.name == "stall" and killed is not None and _stopped(killed):
            self.note("stopped_left", f"round {round_}: {killed} still stopped")
            os.kill(killed, signal.SIGKILL)
        if self.name in ("engine-process", "stall"):  # again when the new engine takes them
            for i, c in enumerate(clients):
                again = await c.wait(marks[i], "error", args.bound_s + 30,
                                     **{"error.message": "restarted"})  # fmt: skip
                if again is None and not c.closed.is_set():
                    self.note("not_told_restart", f"round {round_} client {i}")
        if not engine_fault:  # a killed worker or shard: its sockets close; give them a moment
            await trio.sleep(1.0)
        # every open socket still answers; every closed one gets its session back (or a new one)
        renewed: list[Watched] = list(clients)

        async def recover(i: int, c: Watched) -> None:
            if not c.closed.is_set():
                if await echo(c, args.bound_s + 30):
                    return
                if c.closed.is_set():
                    self.note("closed_late", f"round {round_} client {i} ({self.name})")
                else:
                    self.note("hung", f"round {round_} client {i} open, no echo: "
                              f"{summary(c.events[marks[i]:])}")  # fmt: skip
                    c.cancel.cancel()
            else:
                self.counts[f"closed_{c.close_code}"] += 1
            renewed[i] = await self.replace(served, nursery, c, round_)

        async with trio.open_nursery() as recovering:  # at once: within the resume grace
            for i, c in enumerate(clients):
                recovering.start_soon(recover, i, c)
        await self.check_slots(served, round_, killed)
        if speech is not None:
            await speech.done.wait()
            again = SpeechCall(served.http, self)
            await again.run()
            if again.answer != "audio":
                self.note("speech_not_recovered", f"round {round_}: {again.answer}")
        return renewed

    async def replace(self, served: Served, nursery: trio.Nursery, old: Watched,
                      round_: int) -> Watched:  # fmt: skip
        """A new socket for ``old``'s client: its session resumed, else a new session."""
        try_resume = True
        with trio.fail_after(90):
            while True:
                try:
                    c = await open_watched(nursery, served.ws("/v1/duplex"), old.index)
                except (OSError, trio.TooSlowError, RuntimeError) as exc:  # no handshake
                    self.note("reconnect_failed", repr(exc)[:100])
                    await trio.sleep(0.5)
                    continue
                if try_resume and await resume(c, old, self.args.bound_s):
                    self.counts["resumed"] += 1
                    break
                if try_resume:
                    error = next((e for e in c.events if e["type"] == "error"), None)
                    self.counts[
                        "resume_refused_" + (error["error"]["code"] if error else "closed")
                    ] += 1
                try_resume = False  # the session is gone (its shard was killed): a new one
                if not c.closed.is_set() and await create(c, self.args.bound_s):
                    self.counts["new_session"] += 1
                    break
                c.cancel.cancel()
                await trio.sleep(0.5)
        before = (
            old.events
            if self.counts
            and c.created
            and old.created
            and (c.created["session"]["id"] == old.created["session"]["id"])
            else []
        )
        if not await echo(c, self.args.bound_s + 30, amplitude=0.25, before=before):
            self.note("not_recovered", f"round {round_} client {old.index}")
        return c

    async def check_slots(self, served: Served, round_: int, killed: int | None) -> None:
        """The engine's live slots equal the live sessions once the round has settled."""
        with trio.move_on_after(10):
            while True:
                _, health = await get_json(served.http, "/health")
                slots = metric_sum(await metrics(served.http), "duplex_engine_live_slots")
                if health["sessions"]["live"] == slots:
                    return
                await trio.sleep(0.25)
        self.slot_mismatches.append(
            f"round {round_}: live {health['sessions']['live']} slots {slots} (killed {killed})"
        )


async def faults(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "command": " ".join(["bench/faults.py", *sys.argv[1:]]),
        "machine": machine(),
        "commit": commit(),  # taken at the start: the code that runs
        "phases": {},
    }
    for name in args.phases:
        rounds = args.crashes if name == "engine-crash" else args.kills
        phase = Phase(name, rounds, args)
        report["phases"][name] = await phase.run()
        print(name, json.dumps({k: v for k, v in report["phases"][name].items()
                                if k not in ("examples",)}), file=sys.stderr)  # fmt: skip
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crashes", type=int, default=100)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--bound-s", type=float, default=15.0)
    parser.add_argument("--seed", default="0")
    parser.add_argument("--stall-timeout-s", type=float, default=5.0)
    parser.add_argument("--phases", default="engine-crash,engine-process,stall,worker,shard,asr")
    parser.add_argument("--out", default="bench/results/faults")
    args = parser.parse_args()
    args.phases = args.phases.split(",")
    report = trio.run(faults, args)
    write_report(Path(args.out).with_suffix(".json"), report)
    print(json.dumps({name: {k: v for k, v in p.items() if k not in ("examples",)}
                      for name, p in report["phases"].items()}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
