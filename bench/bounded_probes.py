"""Issue 35's probes against ``duplex serve``: requests within every field's limit that took
the host down, each timed, with the server's RSS before and after.

    .venv/bin/python bench/bounded_probes.py [--workers N --shards K] [--grace S]

Starts ``duplex serve`` (tiny image and video pipelines, espeak-ng, ``http_body_timeout_s``
2 s, ``shutdown_grace_s`` ``--grace``) on a free loopback port as a subprocess and sends:
a 2048x2048 x 16-frame video job, ten 2048x2048 images, one 512x512 image at the default
20 steps, a 1024-frame 512x512 video stream, a speech batch of 4 x 2,048 characters at
speed 0.25 and 48 kHz WAV, 50 bodies that stall after their headers, ``--flood`` (1,100)
stalled bodies held open at once (the server's descriptor limit is ``--max-open-files``,
soft and hard: 1,024, the common default) and then ``/health`` and a speech request timed,
and, last, SIGTERM with five WebSocket peers that read nothing. Prints one
line per probe: the answer, the time to it, and the RSS change; then the time to exit.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio
from websockets.trio.client import connect

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """The server and its children (workers, shards)."""
    total = rss_mb(pid)
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        for child in children.read_text().split():
            total += tree_rss_mb(int(child))
    return total


async def stalled_ws(port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.send_all(
        (
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive_some(1)
    mask = os.urandom(4)
    payload = json.dumps({"type": "session.update", "session": {}}).encode()
    frame = bytes([0x81, 0x80 | len(payload)]) + mask
    frame += bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    with trio.move_on_after(1.0):
        for _ in range(4000):
            await stream.send_all(frame)
    return stream


async def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bounded-"))
    config = folder / "server.toml"
    config.write_text(
        '[server]\nimage_model = "tiny"\nvideo_model = "tiny"\nagent = false\n'
        f'realtime_vad = "energy"\nhttp_body_timeout_s = 2.0\nshutdown_grace_s = {args.grace}\n'
        f"connection_workers = {args.workers}\nsession_shards = {args.shards}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "duplex.cli", "serve", "--port", "0", "--log-format",
               "json", "--config", str(config)]  # fmt: skip
    log = open(folder / "server.log", "wb")  # noqa: SIM115 (the process writes it)
    files = args.max_open_files

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    process = subprocess.Popen(
        command, stderr=log, env=env, cwd=ROOT, preexec_fn=limit_files if files else None
    )
    url = ""
    deadline = time.monotonic() + 120
    while not url and time.monotonic() < deadline:
        await trio.sleep(0.2)
        for line in (folder / "server.log").read_text().splitlines():
            if '"started"' in line:
                url = json.loads(line)["urls"][0]
    assert url, "the server did not start"
    port = int(url.rsplit(":", 1)[1])
    pid = process.pid
    print(f"server pid {pid} on {url}; RSS {tree_rss_mb(pid):.0f} MB")
    async with httpx.AsyncClient(timeout=900) as http:

        async def probe(name: str, path: str, body: dict[str, object]) -> None:
            before = tree_rss_mb(pid)
            started = time.monotonic()
            answer = await http.post(url + path, json=body)
            took = time.monotonic() - started
            code = answer.json().get("error", {}).get("code") if answer.status_code >= 400 else ""
            after = tree_rss_mb(pid)
            print(f"{name}: {answer.status_code} {code} in {took * 1000:.0f} ms; "
                  f"RSS {before:.0f} -> {after:.0f} MB; {len(answer.content)} bytes")  # fmt: skip

        ask = {"prompt": "a cat", "seed": 1}
        big = {**ask, "size": "2048x2048", "num_inference_steps": 1}
        await probe("video 2048x2048 x 16 frames, 1 step", "/v1/videos",
                    {**big, "seconds": 2, "fps": 8})  # fmt: skip
        await probe("10 images 2048x2048, 1 step", "/v1/images/generations", {**big, "n": 10})
        await probe("image 512x512, 20 steps (the SDK's default)", "/v1/images/generations", ask)
        text = ("The quick brown fox jumps over the lazy dog. " * 46)[:2048]
        await probe("speech batch 4 x 2048 chars, speed 0.25, 48 kHz WAV",
                    "/v1/audio/speech/batch",
                    {"input": [text] * 4, "voice": "alloy", "speed": 0.25,
                     "response_format": "wav", "sample_rate": 48000})  # fmt: skip
        started = time.monotonic()
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime/video") as ws:
            await ws.send(json.dumps({"type": "session.start", "prompt": "waves", "width": 512,
                                      "height": 512, "num_frames": 1024}))  # fmt: skip
            while (event := json.loads(await ws.recv()))["type"] != "error":
                pass
        print(f"stream 1024 frames 512x512: error {event['code']} in "
              f"{(time.monotonic() - started) * 1000:.0f} ms")  # fmt: skip

        head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                "application/json\r\nContent-Length: 4000\r\n\r\n{").encode()  # fmt: skip
        before = tree_rss_mb(pid)
        started = time.monotonic()
        closed: list[float] = []
        async with trio.open_nursery() as nursery:

            async def stall() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(head)
                while await stream.receive_some(65536):
                    pass
                closed.append(time.monotonic() - started)

            for _ in range(50):
                nursery.start_soon(stall)
        print(f"50 stalled bodies: all closed by {max(closed):.2f} s (deadline 2 s); "
              f"RSS {before:.0f} -> {tree_rss_mb(pid):.0f} MB")  # fmt: skip

        flood = []
        for _ in range(args.flood):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(head)
            flood.append(stream)
        started = time.monotonic()
        health = await http.get(url + "/health")
        health_s = time.monotonic() - started
        started = time.monotonic()
        speech = await http.post(url + "/v1/audio/speech", json={"input": "Hi.", "voice": "alloy"})
        print(f"{args.flood} stalled bodies held at {files or 'the inherited'} fds: /health "
              f"{health.status_code} in {health_s * 1000:.0f} ms, speech {speech.status_code} in "
              f"{(time.monotonic() - started) * 1000:.0f} ms")  # fmt: skip
        for stream in flood:
            await stream.aclose()

        peers = [await stalled_ws(port) for _ in range(5)]
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while process.poll() is None and time.monotonic() - signalled < 120:
            await trio.sleep(0.02)
        print(f"SIGTERM with 5 non-reading peers: exited "
              f"{process.returncode} after {time.monotonic() - signalled:.2f} s "
              f"(grace {args.grace} s)")  # fmt: skip
        for peer in peers:
            await peer.aclose()
    print(f"server log: {folder / 'server.log'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--flood", type=int, default=1100, help="stalled bodies held at once")
    parser.add_argument(
        "--max-open-files", type=int, default=1024, help="the server's fd limit (0: inherited)"
    )
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the flood's sockets are ours too
    trio.run(main, parser.parse_args())
