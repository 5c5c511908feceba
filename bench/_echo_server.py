"""The bare ceilings for ``bench/sessions.py``: hypercorn (trio) + Starlette WebSocket echo.

    .venv/bin/python bench/_echo_server.py --port P [--tick-ms MS]

No actors, no sessions, no engine: the same server stack as ``duplex serve``
(hypercorn under ``duplex.transport._http.serve_http``, one Starlette app, the same
hypercorn settings)
answers ``session.create`` with a stub ``session.created`` and each
``input_audio_buffer.append`` with one ``response.audio.delta``-shaped JSON
message carrying the same base64 audio (parsed with ``json.loads``, written with
``json.dumps``, as the duplex writer does; the base64 is passed through, not
decoded). ``GET /health`` answers 200 once it is serving. SIGINT/SIGTERM shut
it down gracefully.

``--tick-ms 0`` (default): each append is answered at once. ``--tick-ms MS``:
frame-synchronous, like a batched engine with no model delay: each connection
holds its answers, and a ticker task wakes every MS ms on an absolute schedule
(start + k * MS; ticks it wakes too late for are skipped and counted in
``/health``) and releases every connection's held answers at once; each
connection sends its own, in order, from its own task.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal

import trio
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.transport._http import serve_http

MAX_FRAME_BYTES = 16 * 1024 * 1024  # duplex's server.max_frame_bytes default

Outbox = trio.MemorySendChannel[list[str]]


class Ticker:
    """Holds each connection's answers until the next tick of its own clock."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.held: dict[Outbox, list[str]] = {}
        self.ticks = 0
        self.missed = 0

    def hold(self, outbox: Outbox, text: str) -> None:
        self.held.setdefault(outbox, []).append(text)

    def drop(self, outbox: Outbox) -> None:
        self.held.pop(outbox, None)

    async def run(self) -> None:
        start = trio.current_time()
        k = 1
        while True:
            await trio.sleep_until(start + k * self.period_s)
            held, self.held = self.held, {}
            for outbox, texts in held.items():
                outbox.send_nowait(texts)  # unbounded: never blocks
            self.ticks += 1
            late = max(0, math.floor((trio.current_time() - start) / self.period_s) - k)
            self.missed += late
            k += 1 + late


def answer(event: dict[str, object], seq: int) -> str | None:
    kind = event.get("type")
    if kind == "input_audio_buffer.append":
        out = {
            "type": "response.audio.delta",
            "event_id": f"event_{seq:024x}",
            "server_event_seq": seq,
            "response_id": "resp_bare",
            "item_id": "item_bare",
            "output_index": 0,
            "content_index": 0,
            "epoch": 0,
            "delta": event["audio"],
            "format": "pcm16",
            "sample_rate_hz": 24000,
        }
    elif kind == "session.create":
        out = {"type": "session.created", "session": {"id": "sess_bare"}}
    else:
        return None
    return json.dumps(out, separators=(",", ":"))


def build_app(ticker: Ticker | None) -> Starlette:
    async def health(request: Request) -> Response:
        if ticker is None:
            return JSONResponse({"status": "ok", "model": "bare-echo"})
        return JSONResponse(
            {
                "status": "ok",
                "model": "tick-echo",
                "tick_ms": ticker.period_s * 1000,
                "ticks": ticker.ticks,
                "missed_ticks": ticker.missed,
            }
        )

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        seq = 0
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                event = json.loads(await websocket.receive_text())
                seq += 1
                text = answer(event, seq)
                if text is not None:
                    await websocket.send_text(text)

    async def send_held(websocket: WebSocket, inbox: trio.MemoryReceiveChannel[list[str]]) -> None:
        # a failed send means the client is gone: the receive loop sees that and ends
        with contextlib.suppress(Exception):
            async for texts in inbox:
                for text in texts:
                    await websocket.send_text(text)

    async def echo_ticked(websocket: WebSocket) -> None:
        assert ticker is not None
        await websocket.accept()
        outbox, inbox = trio.open_memory_channel[list[str]](math.inf)
        seq = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_held, websocket, inbox)
            try:
                while True:
                    event = json.loads(await websocket.receive_text())
                    seq += 1
                    text = answer(event, seq)
                    if text is None:
                        continue
                    if event.get("type") == "session.create":
                        outbox.send_nowait([text])  # the handshake is not ticked
                    else:
                        ticker.hold(outbox, text)
            except WebSocketDisconnect:
                pass
            finally:
                ticker.drop(outbox)
                nursery.cancel_scope.cancel()

    endpoint = echo if ticker is None else echo_ticked
    return Starlette(routes=[Route("/health", health), WebSocketRoute("/v1/duplex", endpoint)])


async def main(host: str, port: int, tick_ms: float) -> None:
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.websocket_max_message_size = 2 * MAX_FRAME_BYTES
    config.graceful_timeout = 5.0
    config.accesslog = None
    config.errorlog = None

    async def shutdown_trigger() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return

    ticker = Ticker(tick_ms / 1000) if tick_ms > 0 else None
    async with trio.open_nursery() as nursery:
        if ticker is not None:
            nursery.start_soon(ticker.run)
        app = build_app(ticker)
        await serve_http(app, config, shutdown_trigger=shutdown_trigger)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--tick-ms", type=float, default=0.0, help="answer at ticks every MS ms (0: at once)"
    )
    args = parser.parse_args()
    trio.run(main, args.host, args.port, args.tick_ms)
