"""Fuzz every endpoint of a real ``duplex serve``: generated frames in, typed answers out?

    .venv/bin/python bench/fuzz_endpoints.py [--frames 2000] [--seed 0] [--lanes 4]
        [--endpoints duplex,realtime,chat,pcm,http,speech,speech_stream,media,video_ids,
                     video_stream]
        [--max-frame-bytes 65536] [--out bench/results/fuzz]

Starts ``duplex serve`` (loopback model, an API key, ``max_frame_bytes`` 65,536 so that
frames at and over the limit are cheap) and sends ``--frames`` generated frames to each
WebSocket endpoint and each HTTP route, from a seeded generator, over ``--lanes``
connections at once per endpoint. The kinds of frame (`KINDS`):

- ``mutated``: a valid client event (each event type the endpoint takes, every field
  set; the examples of ``tests/wire/test_field_fuzz.py``, with this session's real
  ids) with 1 to 3 fields, at any depth, replaced by a hostile JSON literal (bignums,
  ``NaN``, ``Infinity``, ``1e999``, negatives, wrong types, a 100 kB string);
- ``wrong_type``: a bad ``type`` (unknown, a number, null, missing) or a top level that is
  not an object;
- ``numbers``: a numeric field set to a huge, tiny or non-finite number;
- ``deep``: nesting 10 to 30,000 levels deep, in a field or at the top;
- ``binary``: random bytes in a binary frame;
- ``bad_base64``: audio that is not base64 (bad characters, padding, non-ASCII);
- ``odd_pcm``: PCM16 with an odd byte count, float32 not whole samples or NaN;
- ``size``: a valid frame padded to the limit - 1, the limit, the limit + 1, and over
  twice the limit (where hypercorn closes the socket with 1009 itself);
- ``garbage``: truncated JSON, random text, an empty frame.

The stream endpoints (``/api/chat``: Ogg/Opus in binary frames; ``/v1/audio/duplex``:
JSON control and float32 PCM) get their own kinds: valid and broken Ogg pages (bit flips,
truncations, pages out of order), every message kind byte, control and metadata payloads,
text frames where binary is expected, PCM of odd lengths and non-finite samples.

**After each frame** a barrier asks for a normal answer: on ``/v1/duplex`` a
``session.update`` (answer: ``session.updated`` with the value it set), on ``/v1/realtime``
the same in Realtime's shape, on ``/v1/audio/duplex`` a message of an unknown type named
for the frame (answer: its ``unknown_event`` error). What arrived before that answer is the
frame's answer. ``/api/chat`` has no message that gets an answer: there, after each frame
the socket must either send ``0x05`` and close with a documented code, or keep its output
stream flowing (a message within 1 s).

Counted per endpoint: **crashes** (the server process gone, or ``/health`` failing
afterwards), **tracebacks** and error lines in the server log, **untyped** answers (a text
message that is not a JSON object with a ``type``, an ``error`` without ``code``, an HTTP
error whose body is not ``{"error": {"code", ...}}``, any 5xx), **hung** frames (no
barrier answer and no close within 10 s), closes by code, error codes, and **unusable**
sessions (the barrier got something other than its normal answer). A closed socket is
replaced by a new session. At the end each endpoint's session must still answer: a spoken
tone is echoed back (``/api/chat``: audio decoded from the Opus reply).

HTTP routes (``/health``, ``/v1/models``, ``/metrics``, ``POST /v1/realtime/client_secrets``,
and the four WebSocket paths without an upgrade) get random methods, query strings,
headers, credentials and bodies (mutated JSON, deep nesting, binary, huge), and one frame
in ten is raw bytes on a TCP socket (a broken request line, bad headers, a truncated
body). Writes ``OUT.json``.

The text-to-speech, image and video endpoints (``bench/_fuzz_media.py``; with ``media`` or
``video_stream`` the server also runs ``--image-model tiny --video-model tiny``):

- ``speech`` (``POST /v1/audio/speech``, ``POST /v1/audio/speech/batch``,
  ``GET /v1/audio/voices``) and ``media`` (``POST /v1/images/generations``,
  ``POST``/``GET /v1/videos``, ``GET``/``DELETE /v1/videos/{id}``,
  ``GET /v1/videos/{id}/content``): per route ``--frames`` requests of the kinds above
  (mutated valid bodies, wrong types, numbers, deep nesting, garbage, binary, bodies at and
  over the route's limit) plus wrong content types, multipart garbage and bad path ids.
  Every answer must be a success or OpenAI's ``{"error": {message, type, param, code}}``
  (a 5xx other than a typed 503 is untyped); after each request a barrier (``GET
  /v1/audio/voices``, ``GET /v1/videos?limit=1``) must answer 200.
- ``speech_stream`` (``WS /v1/audio/speech/stream``): after a valid ``session.config``,
  mutated ``session.config`` / ``input.text`` / ``input.done``, binary frames, frames at and
  over 128 KiB; barrier: an unknown event named for the frame (its ``unknown_event`` error).
- ``video_ids``: the ``{id}`` routes of ``media`` alone. In both, the id a request names
  half the time is a live job's (``LiveJob``: queued or in progress when the request is
  sent; a new one once it finished or the fuzz's ``DELETE`` cancelled it).
- With ``--max-frame-bytes`` above 131,072 (``262144``) a frame can carry the speech
  stream's own 128 KiB text limit; at the default the frame limit closes first (1009).
- ``video_stream`` (``WS /v1/realtime/video``): half the sockets get the frame as their
  first message (a mutated ``session.start``), half a valid tiny start first and then
  mutated ``session.ping`` / ``session.interaction``; barrier: ``session.ping``
  (``session.pong``). A finished generation closes with 1000 and a new socket follows.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _served
from _served import (
    FRAME,
    commit,
    get_json,
    log_problems,
    machine,
    serve,
    silence,
    tone,
    write_report,
)

from tests.wire.test_field_fuzz import (
    HOSTILE,
    _duplex_events,
    _mutated,
    _paths,
    _realtime_events,
)

KEY = "fuzz-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 65_536
KINDS = (
    "mutated",
    "wrong_type",
    "numbers",
    "deep",
    "binary",
    "bad_base64",
    "odd_pcm",
    "size",
    "garbage",
)
NUMBERS = ("1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1e308", "5e-324", str(2**64),
           str(-(2**64)), "1" + "0" * 400, "-0", "0.0000001", str(2**53 + 1))  # fmt: skip
DOCUMENTED_CLOSES = {
    "duplex": {1000, 1009},  # session.close (the session ended); over twice the limit
    "realtime": {1000, 1009},
    "pcm": {1000, 1009},
    "chat": {1000, 1003, 1007, 1008, 1009},  # docs/protocol/moshi.md, "Refusals and errors"
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- generated frames ------------------------------------------------------------------------


def _deep(rng: random.Random) -> str:
    depth = rng.choice([10, 100, 1000, 5000, 20000, 30000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    nested = opener * depth + "1" + closer * depth
    if rng.random() < 0.3:
        return nested
    if rng.random() < 0.5:
        nested = opener * depth + "1"  # unterminated
    return '{"type": "session.update", "session": {"x": ' + nested + "}}"


def _bad_base64(rng: random.Random) -> str:
    good = _b64(tone(1))
    audio = rng.choice(
        [
            "%%%",
            good[:-1],
            good[:-2] + "=",
            good + "====",
            "AAA",
            "A",
            good.replace("A", "-"),
            good.replace("A", "é", 3),
            " " + good,
            "data:audio/pcm;base64," + good,
            "\u0000" * 8,
            good[: len(good) // 2] + "\n" + good[len(good) // 2 :],
            "",
        ]
    )
    return json.dumps({"type": "input_audio_buffer.append", "event_id": "fz", "audio": audio})


def _odd_pcm(rng: random.Random) -> str:
    n = rng.randrange(1, 8000)
    choice = rng.randrange(3)
    if choice == 0:
        audio, fmt = bytes(2 * n + 1), "pcm16"
    elif choice == 1:
        audio, fmt = bytes(4 * n + rng.randrange(1, 4)), "float32"
    else:
        samples = np.zeros(n, dtype="<f4")
        samples[rng.randrange(n)] = rng.choice([np.nan, np.inf, -np.inf, 1e38])
        audio, fmt = samples.tobytes(), "float32"
    event = {"type": "input_audio_buffer.append", "event_id": "fz", "audio": _b64(audio)}
    event["format"] = fmt
    event["sample_rate"] = rng.choice([24000, 16000, 8000, 48000, 44100, 0])
    return json.dumps(event)


def _sized(rng: random.Random, limit: int) -> str:
    size = rng.choice([limit - 1, limit, limit + 1, limit + 4096, 2 * limit + 1])
    event = {"type": "input_audio_buffer.append", "event_id": "fz", "audio": _b64(silence(1))}
    text = json.dumps(event)
    pad = size - len(text.encode()) - len(', "pad": ""')
    event["pad"] = "x" * max(0, pad)
    return json.dumps(event)


def _garbage(rng: random.Random, examples: list[dict[str, Any]]) -> str:
    text = json.dumps(rng.choice(examples))
    choice = rng.randrange(4)
    if choice == 0:
        return text[: rng.randrange(len(text))]
    if choice == 1:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 200)))
    if choice == 2:
        return ""
    return text.replace('"', "'")


def _wrong_type(rng: random.Random, examples: list[dict[str, Any]]) -> str:
    event = copy.deepcopy(rng.choice(examples))
    choice = rng.randrange(6)
    if choice == 0:
        event["type"] = rng.choice(["", "x", "session", "session.created", "error", "a" * 300])
    elif choice == 1:
        event["type"] = rng.choice([1, 1.5, None, True, [], {}])
    elif choice == 2:
        del event["type"]
    elif choice == 3:
        return rng.choice(["[]", "1", '"session.update"', "null", "true", '[{"type": "x"}]'])
    elif choice == 4:
        event["event_id"] = rng.choice([1, None, [], {}, "x" * 100_000])
    else:
        event["type"] = event["type"].upper()
    return json.dumps(event)


def _numbers(rng: random.Random, examples: list[dict[str, Any]]) -> str:
    example = rng.choice(examples)
    numeric = [p for p in _paths(example) if _is_number(_at(example, p))]
    if not numeric:
        numeric = list(_paths(example)) or [("x",)]
    changes = [(rng.choice(numeric), rng.choice(NUMBERS)) for _ in range(rng.randint(1, 2))]
    return _mutated(example, changes)


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_frame(
    kind: str, rng: random.Random, examples: list[dict[str, Any]], limit: int
) -> str | bytes:
    """One generated frame of ``kind`` for a JSON endpoint."""
    if kind == "mutated":
        example = rng.choice(examples)
        paths = list(_paths(example))
        changes = [(rng.choice(paths), rng.choice(HOSTILE)) for _ in range(rng.randint(1, 3))]
        return _mutated(example, changes)
    if kind == "wrong_type":
        return _wrong_type(rng, examples)
    if kind == "numbers":
        return _numbers(rng, examples)
    if kind == "deep":
        return _deep(rng)
    if kind == "binary":
        return rng.randbytes(rng.choice([0, 1, 7, 100, 4096, limit + 1]))
    if kind == "bad_base64":
        return _bad_base64(rng)
    if kind == "odd_pcm":
        return _odd_pcm(rng)
    if kind == "size":
        return _sized(rng, limit)
    return _garbage(rng, examples)


# -- results ---------------------------------------------------------------------------------


class Tally:
    """What one endpoint's frames got."""

    def __init__(self) -> None:
        self.frames = 0
        self.by_kind: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()  # error codes, or accepted event types
        self.closes: Counter[int | None] = Counter()
        self.untyped: list[str] = []
        self.hung: list[str] = []
        self.unusable: list[str] = []
        self.undocumented_closes: list[str] = []
        self.sessions = 0
        self.refused_at_open = 0
        self.final_check: str | None = None

    def report(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "by_kind": dict(self.by_kind),
            "untyped": len(self.untyped),
            "hung": len(self.hung),
            "unusable": len(self.unusable),
            "undocumented_closes": len(self.undocumented_closes),
            "sessions_opened": self.sessions,
            "refused_at_open": self.refused_at_open,
            "closes_by_code": {str(k): v for k, v in sorted(self.closes.items(), key=str)},
            "answers": {k: v for k, v in self.answers.most_common() if v},
            "examples": {
                "untyped": self.untyped[:5],
                "hung": self.hung[:5],
                "unusable": self.unusable[:5],
                "undocumented_closes": self.undocumented_closes[:5],
            },
            "usable_at_end": self.final_check,
        }


def _show(frame: str | bytes) -> str:
    return repr(frame[:160]) + (f"... ({len(frame)} bytes)" if len(frame) > 160 else "")


def classify(
    tally: Tally,
    message: str | bytes,
    frame: str | bytes,
    *,
    binary: str = "<binary audio>",
    flat_errors: bool = False,
) -> dict[str, Any] | None:
    """A server message: counted; returns the event if it is a typed JSON object.
    ``binary``: how a binary message is counted; ``flat_errors``: the socket's ``error``
    carries its ``code`` and ``message`` itself (the speech and video streams), not in an
    ``error`` object."""
    if isinstance(message, bytes):
        tally.answers[binary] += 1
        return None
    try:
        event = json.loads(message)
    except ValueError:
        tally.untyped.append(f"not JSON: {message[:200]!r} after {_show(frame)}")
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        tally.untyped.append(f"no type: {message[:200]!r} after {_show(frame)}")
        return None
    if event["type"] == "error":
        error = event if flat_errors else event.get("error")
        if (
            not isinstance(error, dict)
            or not isinstance(error.get("code"), str)
            or (flat_errors and not isinstance(error.get("message"), str))
        ):
            tally.untyped.append(f"error without code: {message[:200]!r}")
            return event
        tally.answers["error:" + error["code"]] += 1
    return event


async def refused(tally: Tally, exc: ConnectionClosed) -> None:
    """A socket closed while its session opened: only admission (1013) may do that."""
    code = exc.rcvd.code if exc.rcvd is not None else None
    if code != 1013:
        raise exc
    tally.refused_at_open += 1
    await trio.sleep(0.5)


Step = Callable[[str, int], Awaitable[bool]]
"""One frame of a kind, numbered ``n`` in its lane, sent with its barrier: ``False`` once
the socket is closed."""


async def frame_lane(
    url: str,
    frames: int,
    rng: random.Random,
    tally: Tally,
    kinds: Sequence[str],
    opened: Callable[[ClientConnection], Awaitable[Step]],
    finish: Callable[[ClientConnection], Awaitable[object]] | None = None,
) -> None:
    """The frame loop of every WebSocket endpoint: a socket (a new one after each close),
    ``opened`` on it (its handshake; returns the socket's step), then frames of random
    kinds until ``frames`` are sent; ``finish`` on a socket still open at the end. A
    socket closed while it opened is refused by admission (``refused``)."""
    n = 0
    while n < frames:
        try:
            async with connect(url, additional_headers=AUTH, max_queue=None,
                               max_size=None) as ws:  # fmt: skip
                step = await opened(ws)
                tally.sessions += 1
                while n < frames:
                    kind = kinds[rng.randrange(len(kinds))]
                    n += 1
                    tally.frames += 1
                    tally.by_kind[kind] += 1
                    if not await step(kind, n):
                        break
                else:
                    if finish is not None:
                        await finish(ws)
        except ConnectionClosed as exc:  # refused at open (the machine is full): later
            await refused(tally, exc)


# -- JSON WebSocket endpoints ----------------------------------------------------------------


class JsonEndpoint:
    """``/v1/duplex`` or ``/v1/realtime``: open a session, then frame, barrier, frame, ..."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.ids = {"session": "duplex-x", "response": "resp_x", "item": "item_x"}

    async def open(self, ws: ClientConnection) -> dict[str, Any]:
        if self.name == "duplex":
            await ws.send(json.dumps({"type": "session.create", "session": {}}))
        created = json.loads(await ws.recv())
        if created["type"] != "session.created":
            raise RuntimeError(f"no session: {created}")
        self.ids["session"] = created["session"]["id"]
        return created

    def examples(self) -> list[dict[str, Any]]:
        events = _duplex_events(self.ids) if self.name == "duplex" else _realtime_events(self.ids)
        return [{"type": kind, "event_id": "evt_1", **body} for kind, body in events]

    def barrier(self, n: int) -> tuple[str, Callable[[dict[str, Any]], bool]]:
        """A valid event and a test for its normal answer (the value it set is unique)."""
        value = 100 + n % 500
        if self.name == "duplex":
            session = {"overlap_short_ack_ms": value, "overlap_barge_in_ms": 5000}
            event = {"type": "session.update", "event_id": f"barrier-{n}", "session": session}

            def answered(e: dict[str, Any]) -> bool:
                return (
                    e["type"] == "session.updated"
                    and e["session"].get("overlap_short_ack_ms") == value
                )
        else:
            vad = {"type": "server_vad", "silence_duration_ms": value}
            session = {"type": "realtime", "audio": {"input": {"turn_detection": vad}}}
            event = {"type": "session.update", "event_id": f"barrier-{n}", "session": session}

            def answered(e: dict[str, Any]) -> bool:
                if e["type"] != "session.updated":
                    return False
                detection = e["session"]["audio"]["input"].get("turn_detection") or {}
                return detection.get("silence_duration_ms") == value

        return json.dumps(event), answered

    def note_ids(self, event: dict[str, Any]) -> None:
        if event["type"] == "response.created":
            self.ids["response"] = event["response"]["id"]
        elif event["type"] in ("response.output_item.added", "conversation.item.created"):
            item = event.get("item") or {}
            if isinstance(item.get("id"), str):
                self.ids["item"] = item["id"]

    async def lane(self, frames: int, rng: random.Random, tally: Tally, lane: int) -> None:
        async def opened(ws: ClientConnection) -> Step:
            await self.open(ws)
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": _b64(tone(4))}))  # fmt: skip

            async def step(kind: str, n: int) -> bool:
                frame = json_frame(kind, rng, self.examples(), LIMIT)
                return await self._one(ws, frame, lane * 100_000 + n, tally)

            return step

        async def close(ws: ClientConnection) -> None:
            await ws.send(json.dumps({"type": "session.close"}))

        await frame_lane(self.url, frames, rng, tally, KINDS, opened, close)

    async def _one(self, ws: ClientConnection, frame: str | bytes, n: int, tally: Tally) -> bool:
        """One frame and its barrier; ``False`` once the socket is closed."""
        barrier, answered = self.barrier(n)
        try:
            await ws.send(frame)
            await ws.send(barrier)
            with trio.fail_after(10):
                while True:
                    event = classify(tally, await ws.recv(), frame)
                    if event is None:
                        continue
                    self.note_ids(event)
                    if answered(event):
                        return True
                    mine = event["type"] == "error" and event["error"].get("event_id")
                    if mine == f"barrier-{n}":
                        tally.unusable.append(f"{event['error']} after {_show(frame)}")
                        return True
                    if event["type"] == "session.updated" and "barrier" in barrier:
                        tally.answers["session.updated"] += 1
                    elif event["type"] != "error":
                        tally.answers[event["type"]] += 1
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            tally.closes[code] += 1
            if code not in DOCUMENTED_CLOSES[self.name]:
                tally.undocumented_closes.append(f"close {code} after {_show(frame)}")
            return False
        except trio.TooSlowError:
            tally.hung.append(_show(frame))
            return False

    async def usable(self) -> str:
        """A fresh session on this endpoint still echoes a spoken tone."""
        async with connect(self.url, additional_headers=AUTH, max_size=None) as ws:
            await self.open(ws)
            spoken = tone(8)
            for i in range(0, len(spoken + silence(10)), 2 * FRAME):
                chunk = (spoken + silence(10))[i : i + 2 * FRAME]
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": _b64(chunk)}))  # fmt: skip
            heard = 0
            delta = "response.audio.delta"
            if self.name != "duplex":
                delta = "response.output_audio.delta"
            with trio.fail_after(20):
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == delta:
                        heard += len(base64.b64decode(event["delta"]))
                    if event["type"] == "response.done":
                        break
            return "echo ok" if heard >= len(spoken) else f"echo short: {heard} bytes"


# -- /v1/audio/duplex --------------------------------------------------------------------------


class PcmEndpoint:
    def __init__(self, url: str) -> None:
        self.url = url

    def frame(self, kind: str, rng: random.Random) -> str | bytes:
        if kind == "mutated":
            base = rng.choice(
                [{"type": "open", "persona": "p", "voice": "v"}, {"type": "close"},
                 {"type": "text", "text": "hi"}]
            )  # fmt: skip
            paths = list(_paths(base))
            return _mutated(base, [(rng.choice(paths), rng.choice(HOSTILE))])
        if kind in ("wrong_type", "numbers", "garbage"):
            return (
                _wrong_type(rng, [{"type": "open"}])
                if kind != "garbage"
                else _garbage(rng, [{"type": "open", "persona": "x"}])
            )
        if kind == "deep":
            return _deep(rng)
        if kind in ("binary", "odd_pcm"):
            n = rng.randrange(0, 4000)
            data = bytearray(rng.randbytes(n))
            if kind == "odd_pcm" and rng.random() < 0.5:
                samples = np.zeros(max(1, n // 4), dtype="<f4")
                samples[rng.randrange(len(samples))] = rng.choice([np.nan, np.inf, -np.inf])
                return samples.tobytes()
            return bytes(data)
        if kind == "bad_base64":  # no base64 here: valid float32 of any length instead
            return tone_f32(rng.randrange(1, 3)).tobytes()[: 4 * rng.randrange(1, 3840)]
        size = rng.choice([LIMIT - 4, LIMIT, LIMIT + 4, 2 * LIMIT + 4])
        return bytes(size) if rng.random() < 0.5 else json.dumps({"type": "x", "p": "y" * size})

    async def lane(self, frames: int, rng: random.Random, tally: Tally, lane: int) -> None:
        async def opened(ws: ClientConnection) -> Step:
            await ws.send(json.dumps({"type": "open"}))
            with trio.fail_after(10):
                while await ws.recv() != '{"type":"ready"}':
                    pass

            async def step(kind: str, n: int) -> bool:
                return await self._one(ws, self.frame(kind, rng), lane * 100_000 + n, tally)

            return step

        await frame_lane(self.url, frames, rng, tally, KINDS, opened)

    async def _one(self, ws: ClientConnection, frame: str | bytes, n: int, tally: Tally) -> bool:
        name = f"barrier-{n}"
        try:
            await ws.send(frame)
            await ws.send(json.dumps({"type": name}))
            with trio.fail_after(10):
                while True:
                    event = classify(tally, await ws.recv(), frame)
                    if event is None:
                        continue
                    if event["type"] == "error" and name in event["error"].get("message", ""):
                        tally.answers["error:unknown_event"] -= 1  # the barrier's own
                        return True
                    if event["type"] != "error":
                        tally.answers[event["type"]] += 1
                    if event["type"] == "done":
                        pass  # the session ended (a 'close'): the socket closes next
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            tally.closes[code] += 1
            if code not in DOCUMENTED_CLOSES["pcm"]:
                tally.undocumented_closes.append(f"close {code} after {_show(frame)}")
            return False
        except trio.TooSlowError:
            tally.hung.append(_show(frame))
            return False

    async def usable(self) -> str:
        async with connect(self.url, additional_headers=AUTH, max_size=None) as ws:
            await ws.send(json.dumps({"type": "open"}))
            pcm = np.concatenate([tone_f32(8), np.zeros(10 * FRAME, "<f4")])
            for i in range(0, len(pcm), FRAME):  # one frame a message: under the size limit
                await ws.send(pcm[i : i + FRAME].tobytes())
            loud = 0
            with trio.fail_after(20):
                while loud < 6 * FRAME:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        pcm = np.frombuffer(message, dtype="<f4")
                        loud += int((np.abs(pcm) > 0.05).sum())
            return "echo ok"


def tone_f32(frames: int) -> np.ndarray:
    return (np.frombuffer(tone(frames), dtype="<i2") / 32768.0).astype("<f4")


# -- /api/chat ---------------------------------------------------------------------------------


class ChatEndpoint:
    """Moshi's ``/api/chat``: binary frames, a kind byte first; Ogg/Opus audio."""

    def __init__(self, url: str) -> None:
        import sphn

        self.url = url
        writer = sphn.OpusStreamWriter(24000)
        pcm = tone_f32(12)
        self.pages: list[bytes] = []
        for i in range(0, len(pcm), FRAME):
            data = writer.append_pcm(pcm[i : i + FRAME])
            if data:
                self.pages.append(bytes(data))

    def frame(self, kind: str, rng: random.Random) -> str | bytes:
        if kind == "mutated":  # a valid audio message, bits flipped
            data = bytearray(b"\x01" + rng.choice(self.pages))
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(1, len(data))] ^= 1 << rng.randrange(8)
            return bytes(data)
        if kind == "wrong_type":
            return bytes([rng.choice([0, 2, 5, 7, 8, 0x7F, 0xFF])]) + rng.randbytes(10)
        if kind == "numbers":  # control and metadata, any payload
            if rng.random() < 0.5:
                return b"\x03" + rng.randbytes(rng.choice([0, 1, 2, 100]))
            meta = _mutated({"a": 1, "b": [1, 2]}, [(("a",), rng.choice(HOSTILE))])
            return b"\x04" + (meta.encode() if rng.random() < 0.8 else rng.randbytes(20))
        if kind == "deep":
            return b"\x04" + _deep(rng).encode()
        if kind == "binary":
            return rng.randbytes(rng.randrange(0, 3000))
        if kind == "bad_base64":  # a text frame where binary is expected
            return rng.choice(["hello", json.dumps({"type": "session.update"}), ""])
        if kind == "odd_pcm":  # pages out of order, truncated or concatenated
            choice = rng.randrange(3)
            if choice == 0:
                return b"\x01" + rng.choice(self.pages[1:])
            if choice == 1:
                page = rng.choice(self.pages)
                return b"\x01" + page[: rng.randrange(1, len(page))]
            return b"\x01" + b"".join(self.pages[:2]) + rng.randbytes(50)
        if kind == "size":
            size = rng.choice([LIMIT - 1, LIMIT, LIMIT + 1, 2 * LIMIT + 1])
            return b"\x06" + bytes(size - 1) if rng.random() < 0.5 else b"\x01" + bytes(size - 1)
        return rng.choice([b"", b"\x06", b"\x03\x00", b"\x01", b"\x04"])

    async def lane(self, frames: int, rng: random.Random, tally: Tally, lane: int) -> None:
        async def opened(ws: ClientConnection) -> Step:
            with trio.fail_after(10):
                while (await ws.recv())[:1] != b"\x00":  # the handshake
                    pass
            if rng.random() < 0.5:  # half the sessions are mid-stream
                for page in self.pages[:4]:
                    await ws.send(b"\x01" + page)

            async def step(kind: str, n: int) -> bool:
                return await self._one(ws, self.frame(kind, rng), tally)

            return step

        await frame_lane(self.url, frames, rng, tally, KINDS, opened)

    async def _one(self, ws: ClientConnection, frame: str | bytes, tally: Tally) -> bool:
        """After the frame: ``0x05`` then a documented close, or the stream keeps flowing."""
        try:
            await ws.send(frame)
            flowing = 0
            with trio.move_on_after(0.25):
                while True:
                    message = await ws.recv()
                    if isinstance(message, str):
                        tally.untyped.append(f"text from /api/chat: {message[:100]!r}")
                        continue
                    kind = message[:1]
                    if kind == b"\x05":
                        code = message[1:].decode(errors="replace").split(":", 1)[0]
                        tally.answers["error:" + code] += 1
                    elif kind in (b"\x01", b"\x02"):
                        flowing += 1
                    else:
                        tally.untyped.append(f"kind {kind!r} from /api/chat")
            if flowing:
                return True
            with trio.fail_after(10):  # nothing in 0.25 s: a close, or at least a frame
                message = await ws.recv()
                if isinstance(message, bytes) and message[:1] == b"\x05":
                    code = message[1:].decode(errors="replace").split(":", 1)[0]
                    tally.answers["error:" + code] += 1
                    await ws.recv()  # the close
                return True
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            tally.closes[code] += 1
            if code not in DOCUMENTED_CLOSES["chat"]:
                tally.undocumented_closes.append(f"close {code} after {_show(frame)}")
            return False
        except trio.TooSlowError:
            tally.hung.append(_show(frame))
            return False

    async def usable(self) -> str:
        import sphn

        writer, reader = sphn.OpusStreamWriter(24000), sphn.OpusStreamReader(24000)
        async with connect(self.url, additional_headers=AUTH, max_size=None) as ws:
            with trio.fail_after(10):
                while (await ws.recv())[:1] != b"\x00":
                    pass
            pcm = np.concatenate([tone_f32(8), np.zeros(12 * FRAME, "<f4")])
            for i in range(0, len(pcm), FRAME):
                data = writer.append_pcm(pcm[i : i + FRAME])
                if data:
                    await ws.send(b"\x01" + bytes(data))
            loud = 0
            with trio.fail_after(20):
                while loud < 4 * FRAME:
                    message = await ws.recv()
                    if message[:1] == b"\x01":
                        out = reader.append_bytes(message[1:])
                        loud += int((np.abs(out) > 0.05).sum())
            return "echo ok"


# -- HTTP routes -------------------------------------------------------------------------------

ROUTES = {
    "/health": "GET",
    "/v1/models": "GET",
    "/metrics": "GET",
    "/v1/realtime/client_secrets": "POST",
    "websocket paths over plain HTTP": "GET",
}
WS_PATHS = ("/v1/duplex", "/v1/realtime", "/api/chat", "/v1/audio/duplex")
SECRET_BODY = {
    "expires_after": {"anchor": "created_at", "seconds": 60},
    "session": {"type": "realtime"},
}


def http_request(route: str, rng: random.Random) -> dict[str, Any]:
    """One generated request (method, path with query, headers, body) for ``route``."""
    path = rng.choice(WS_PATHS) if route.startswith("websocket") else route
    method = ROUTES[route] if rng.random() < 0.6 else rng.choice(
        ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW"]
    )  # fmt: skip
    query = rng.choice(
        ["", "?a=1", "?%zz", "?" + "x" * 5000, "?a=%00", "?duplex=1&duplex=2", "?=&&=",
         "?model=" + "é" * 20, "?a[]=1&a[b]=2"]
    )  # fmt: skip
    headers = {}
    auth = rng.random()
    if auth < 0.7:
        headers.update(AUTH)
    elif auth < 0.8:
        headers["Authorization"] = rng.choice(["Bearer wrong", "Basic x", "Bearer", "x" * 4000])
    if rng.random() < 0.3:
        headers["Content-Type"] = rng.choice(
            ["application/json", "text/plain", "application/x-www-form-urlencoded",
             "multipart/form-data; boundary=x", "application/json; charset=utf-16", "\x7f"]
        )  # fmt: skip
    if rng.random() < 0.1:
        headers["Origin"] = rng.choice(["http://evil.example", "null", "file://"])
    if rng.random() < 0.1:
        headers[rng.choice(["Upgrade", "Connection", "Sec-WebSocket-Version"])] = rng.choice(
            ["websocket", "Upgrade", "13", "x"]
        )
    body: bytes = b""
    kind = rng.randrange(6)
    if kind == 0:
        body = json.dumps(SECRET_BODY).encode()
    elif kind == 1:
        paths = list(_paths(SECRET_BODY))
        changes = [(rng.choice(paths), rng.choice(HOSTILE)) for _ in range(rng.randint(1, 3))]
        body = _mutated(SECRET_BODY, changes).encode()
    elif kind == 2:
        body = _deep(rng).encode()
    elif kind == 3:
        body = rng.randbytes(rng.choice([1, 100, 10_000]))
    elif kind == 4:
        body = rng.choice([b"[]", b"null", b"1", b'"x"', b"{", b"\xff\xfe{}"])
    return {"method": method, "url": path + query, "headers": headers, "body": body}


RAW = (
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"\r\nzz\r\n",
    b"GET /v1/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"GET /v1/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"y" * 70_000 + b"\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello on a plain port
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    b"GET /health\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
)


async def raw_request(port: int, rng: random.Random) -> str:
    data = bytearray(rng.choice(RAW))
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    if rng.random() < 0.3:
        data = data[: rng.randrange(1, len(data))]

    def exchange() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(bytes(data))
            s.shutdown(socket.SHUT_WR)
            try:
                reply = s.recv(200)
            except (TimeoutError, ConnectionResetError):
                return "no answer"
        return reply.split(b"\r\n", 1)[0].decode(errors="replace")[:40] or "closed"

    return await trio.to_thread.run_sync(exchange)


async def _request(client: httpx.AsyncClient, request: dict[str, Any]) -> httpx.Response:
    return await client.request(
        request["method"], request["url"], headers=request["headers"], content=request["body"]
    )


async def fuzz_http(http: str, port: int, route: str, frames: int, rng: random.Random,
                    tally: Tally) -> None:  # fmt: skip
    async with httpx.AsyncClient(base_url=http, timeout=10) as client:
        for _ in range(frames):
            tally.frames += 1
            if rng.random() < 0.1:
                tally.by_kind["raw"] += 1
                line = await raw_request(port, rng)
                status = line.split(" ")[1] if line.startswith("HTTP/") else line
                tally.answers["raw:" + status] += 1
                if status.startswith("5"):
                    tally.untyped.append(f"raw {status}")
                continue
            tally.by_kind["request"] += 1
            request = http_request(route, rng)
            try:
                reply = await _request(client, request)
            except httpx.RemoteProtocolError:  # a pooled connection the server had closed
                tally.answers["retried on a new connection"] += 1
                async with httpx.AsyncClient(base_url=http, timeout=10) as fresh:
                    try:
                        reply = await _request(fresh, request)
                    except httpx.TransportError as exc:
                        tally.hung.append(f"{request!r:.300}: {exc!r}")
                        continue
            except httpx.TransportError as exc:
                tally.hung.append(
                    f"{request['method']} {request['url'][:80]} {request['headers']!r:.300} "
                    f"body {request['body'][:60]!r}: {exc!r}"
                )
                continue
            tally.answers[str(reply.status_code)] += 1
            if reply.status_code >= 500:
                tally.untyped.append(f"{reply.status_code} for {request['method']} "
                                     f"{request['url'][:80]}")  # fmt: skip
            elif reply.status_code >= 400 and request["method"] != "HEAD":
                try:
                    code = reply.json()["error"]["code"]
                    assert isinstance(code, str)
                except (ValueError, KeyError, TypeError, AssertionError):
                    tally.untyped.append(
                        f"{reply.status_code} {reply.text[:80]!r} for {request['method']} "
                        f"{request['url'][:60]}"
                    )
                    continue
                tally.answers[f"{reply.status_code}:{code}"] += 1
                tally.answers[str(reply.status_code)] -= 1


# -- the run -----------------------------------------------------------------------------------


async def fuzz(args: argparse.Namespace) -> dict[str, Any]:
    code = commit()  # the code that runs: taken at the start
    out = Path(args.out)
    global LIMIT
    LIMIT = args.max_frame_bytes
    env = {
        "DUPLEX_MAX_FRAME_BYTES": str(LIMIT),
        "DUPLEX_API_KEYS": KEY,
        "DUPLEX_SESSION__DISCONNECT_GRACE_S": "2",  # a socket closed mid-fuzz frees its slot soon
        "DUPLEX_AUTH_FAILURE_BURST": "1000000",  # wrong keys get 401, never lock the fuzz out
    }
    _served.HEADERS.update(AUTH)
    results: dict[str, Any] = {}
    started = time.monotonic()
    import _fuzz_media  # here: it imports this module's generators

    media = {"media", "video_ids", "video_stream"} & set(args.endpoints)
    flags = ["--image-model", "tiny", "--video-model", "tiny"] if media else []
    async with serve(
        ["--model", "loopback", *flags], env=env, log=out.with_suffix(".log")
    ) as served:
        endpoints: dict[str, Any] = {
            "duplex": JsonEndpoint("duplex", served.ws("/v1/duplex")),
            "realtime": JsonEndpoint("realtime", served.ws("/v1/realtime")),
            "chat": ChatEndpoint(served.ws("/api/chat")),
            "pcm": PcmEndpoint(served.ws("/v1/audio/duplex")),
            "speech_stream": _fuzz_media.SpeechStreamEndpoint(
                served.ws("/v1/audio/speech/stream"), LIMIT
            ),
            "video_stream": _fuzz_media.VideoStreamEndpoint(served.ws("/v1/realtime/video"), LIMIT),
        }
        for name in args.endpoints:
            if name in ("speech", "media", "video_ids"):
                t = time.monotonic()
                found: dict[str, Any] = {}
                await _fuzz_media.fuzz_http_routes(served.http, name, args.frames, args.seed,
                                                   found)  # fmt: skip
                for route, result in found.items():
                    results[route] = result
                    print(route, json.dumps({k: v for k, v in result.items()
                                             if k != "examples"}), file=sys.stderr)  # fmt: skip
                continue
            if name == "http":
                continue
            endpoint = endpoints[name]
            tally = Tally()
            t = time.monotonic()
            share = [args.frames // args.lanes + (i < args.frames % args.lanes)
                     for i in range(args.lanes)]  # fmt: skip
            async with trio.open_nursery() as nursery:
                for lane, count in enumerate(share):
                    rng = random.Random(f"{args.seed}-{name}-{lane}")
                    nursery.start_soon(endpoint.lane, count, rng, tally, lane)
            try:
                tally.final_check = await endpoint.usable()
            except Exception as exc:
                tally.final_check = f"FAILED: {exc!r}"
            results[name] = {**tally.report(), "seconds": round(time.monotonic() - t, 1)}
            print(name, json.dumps({k: v for k, v in results[name].items() if k != "examples"}),
                  file=sys.stderr)  # fmt: skip
        if "http" in args.endpoints:
            for route in ROUTES:
                tally = Tally()
                t = time.monotonic()
                rng = random.Random(f"{args.seed}-{route}")
                await fuzz_http(served.http, served.port, route, args.frames, rng, tally)
                status, health = await get_json(served.http, "/health")
                tally.final_check = f"/health {status} {health.get('status')}"
                results[route] = {**tally.report(), "seconds": round(time.monotonic() - t, 1)}
                print(route, json.dumps({k: v for k, v in results[route].items()
                                         if k != "examples"}), file=sys.stderr)  # fmt: skip
        alive = served.process.poll() is None
        status, health = await get_json(served.http, "/health")
    problems = log_problems(served.log_lines())
    return {
        "command": " ".join(["bench/fuzz_endpoints.py", *sys.argv[1:]]),
        "machine": machine(),
        "commit": code,
        "frames_per_endpoint": args.frames,
        "max_frame_bytes": LIMIT,
        "seconds": round(time.monotonic() - started, 1),
        "server_alive_at_end": alive,
        "health_at_end": [status, health.get("status") if isinstance(health, dict) else health],
        "server_exit_code": served.process.returncode,
        "server_log": problems,
        "endpoints": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--seed", default="0")
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--endpoints", default="duplex,realtime,chat,pcm,http")
    parser.add_argument("--out", default="bench/results/fuzz")
    parser.add_argument("--max-frame-bytes", type=int, default=LIMIT,
                        help="the server's max_frame_bytes (the size kinds follow it)")  # fmt: skip
    args = parser.parse_args()
    args.endpoints = args.endpoints.split(",")
    report = trio.run(fuzz, args)
    write_report(Path(args.out).with_suffix(".json"), report)
    summary = {
        name: {k: r[k] for k in ("frames", "untyped", "hung", "unusable", "undocumented_closes",
                                 "usable_at_end")}
        for name, r in report["endpoints"].items()
    }  # fmt: skip
    print(json.dumps({"server_log": report["server_log"], "alive": report["server_alive_at_end"],
                      "endpoints": summary}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
