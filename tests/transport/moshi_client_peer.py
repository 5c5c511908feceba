"""Kyutai's real ``moshi.client`` (``moshi==0.2.13``), headless, against a server's ``/api/chat``.

Run by the Python of the separate environment ``scripts/moshi_client_venv.sh`` builds (its
``moshi`` pins an older torch than the project's): never imported by the test suite.

    python moshi_client_peer.py PORT SECONDS

The client's sounddevice streams are replaced with fakes driven by threads at its own
cadence (1,920 samples every 80 ms): the input plays a 440 Hz tone, the output pulls
what the client queued for playback. Prints one JSON line: what the client received.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
import time
from types import SimpleNamespace

import moshi.client
import numpy as np
from moshi.client_utils import RawPrinter

FRAME = 1920


class _FakeStream:
    """A sounddevice stream whose callback a thread calls every 80 ms while it is open."""

    played: list[np.ndarray] = []

    def __init__(self, *, samplerate, channels, blocksize, callback, output: bool) -> None:
        assert (samplerate, channels, blocksize) == (24000, 1, FRAME)
        self.callback = callback
        self.output = output
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.index = 0

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            if self.output:
                out = np.zeros((FRAME, 1), dtype=np.float32)
                self.callback(out, FRAME, None, None)
                _FakeStream.played.append(out[:, 0].copy())
            else:
                n = np.arange(self.index * FRAME, (self.index + 1) * FRAME)
                tone = (0.3 * np.sin(2 * np.pi * 440 * n / 24000)).astype(np.float32)
                self.callback(tone[:, None], FRAME, None, None)
            self.index += 1
            next_at += 0.08
            time.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _input(**kw):
    return _FakeStream(output=False, **kw)


def _output(**kw):
    return _FakeStream(output=True, **kw)


async def _main(port: int, seconds: float) -> dict:
    moshi.client.sd.InputStream = _input
    moshi.client.sd.OutputStream = _output
    tokens, logs = io.StringIO(), io.StringIO()
    args = SimpleNamespace(url=None, https=False, host="127.0.0.1", port=port)
    client = asyncio.create_task(moshi.client.run(RawPrinter(tokens, logs), args))
    done, _ = await asyncio.wait([client], timeout=seconds)
    played = list(_FakeStream.played)
    result = {  # read before the cancel: its mic thread then writes to a closing socket
        "ended": "server_closed" if done else "timeout",
        "played_frames": len(played),
        "loud_frames": sum(1 for f in played if np.sqrt(np.mean(f * f)) > 0.05),
        "text": tokens.getvalue(),
        "log": logs.getvalue(),
    }
    client.cancel()
    await asyncio.gather(client, return_exceptions=True)
    return result


if __name__ == "__main__":
    result = asyncio.run(_main(int(sys.argv[1]), float(sys.argv[2])))
    print(json.dumps(result))
