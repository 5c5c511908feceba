"""The bare ceiling for ``bench/sessions.py``: hypercorn (trio) + Starlette WebSocket echo.

    .venv/bin/python bench/_echo_server.py --port P

No actors, no sessions, no engine: the same server stack as ``duplex serve``
(hypercorn's trio ``serve()``, one Starlette app, the same hypercorn settings)
answers ``session.create`` with a stub ``session.created`` and each
``input_audio_buffer.append`` at once with one ``response.audio.delta``-shaped
JSON message carrying the same base64 audio (parsed with ``json.loads``,
written with ``json.dumps``, as the duplex writer does; the base64 is passed
through, not decoded). ``GET /health`` answers 200 once it is serving.
SIGINT/SIGTERM shut it down gracefully.
"""

from __future__ import annotations

import argparse
import json
import signal

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

MAX_FRAME_BYTES = 16 * 1024 * 1024  # duplex's server.max_frame_bytes default


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "model": "bare-echo"})


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    seq = 0
    try:
        while True:
            text = await websocket.receive_text()
            event = json.loads(text)
            seq += 1
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
                continue
            await websocket.send_text(json.dumps(out, separators=(",", ":")))
    except WebSocketDisconnect:
        pass


def build_app() -> Starlette:
    return Starlette(
        routes=[Route("/health", health), WebSocketRoute("/v1/duplex", echo)],
    )


async def main(host: str, port: int) -> None:
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

    await serve(build_app(), config, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    trio.run(main, args.host, args.port)
