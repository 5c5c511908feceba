"""What the reliability benches share: a ``duplex serve`` subprocess, its process tree, its
log, its ``/health`` and ``/metrics``, and a small WebSocket client that records everything.

Used by ``bench/fuzz_endpoints.py``, ``bench/faults.py``, ``bench/disconnects.py`` and
``bench/soak.py`` (docs/reliability.md). The server is always a real subprocess on a free
loopback port, started from this working tree, logging JSON lines to a file that each
bench scans for tracebacks afterwards. Starting and stopping it, the free port, the
process tree and reading ``/metrics`` are the tests' own (``tests/helpers.py``, one
copy of each): a bench runs from a checkout, beside its tests.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers import parse_metrics, process_tree, start_server, stop_server  # noqa: E402

tree = process_tree
"""``pid`` and every live process under it (``bench/soak.py`` reads their memory)."""

FRAME = 1920  # 80 ms at 24 kHz
PERIOD = 0.08
FRONTEND = "duplex.topology._frontend"
SHARD = "duplex.topology._shard"
ENGINE = "duplex.topology._engine_process"
CHILD_KINDS = {"worker": FRONTEND, "shard": SHARD, "engine": ENGINE}

HEADERS: dict[str, str] = {}
"""Sent with every HTTP request of these helpers (a bench that sets an API key adds it)."""

BASE_ENV = {
    "DUPLEX_SESSION__OVERLAP_POLICY": "model",  # the loopback echoes every speaking frame
    "DUPLEX_REALTIME_VAD": "energy",  # no silero to load: the benches speak in tones
}


def machine() -> str:
    """The machine, in words, for result files (no host names or paths)."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        if found:
            model = found.group(1).strip()
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB, {platform.system()}"


def commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


# -- processes -------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def children(pid: int, module: str | None = None) -> list[int]:
    """The live children of ``pid`` (running ``python -m module``, if named)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if module is None or module.encode() in argv:
            found.append(int(entry))
    return sorted(found)


def process_name(pid: int, root: int) -> str:
    if pid == root:
        return "server"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return "gone"
    for kind, module in CHILD_KINDS.items():
        if module in argv:
            return kind
    return Path(argv[0]).name if argv and argv[0] else "other"


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            found = re.search(r"^VmRSS:\s*(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


# -- the server ------------------------------------------------------------------------


@dataclass
class Served:
    """A running ``duplex serve`` subprocess."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    started_s: float

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def child_pids(self, kind: str) -> list[int]:
        return children(self.pid, CHILD_KINDS[kind])

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def log_problems(lines: Sequence[str]) -> dict[str, Any]:
    """Tracebacks and error lines in a server log (JSON lines, or anything else a process
    wrote to stderr), with a few examples of each."""
    tracebacks: list[str] = []
    errors: list[str] = []
    for line in lines:
        if "Traceback (most recent call last)" in line or '"exception"' in line:
            tracebacks.append(line[:400])
        elif '"level": "error"' in line or '"level": "critical"' in line:
            errors.append(line[:400])
    return {
        "tracebacks": len(tracebacks),
        "error_lines": len(errors),
        "traceback_examples": tracebacks[:3],
        "error_examples": errors[:5],
    }


async def wait_health(http: str, timeout_s: float, process: subprocess.Popen | None) -> dict:
    """``/health`` once it answers 200 (the server admits)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5, headers=HEADERS) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"duplex serve exited with {process.returncode}")
            try:
                reply = await client.get(http + "/health")
                if reply.status_code == 200 and reply.json()["status"] == "ok":
                    return reply.json()
            except httpx.TransportError:
                pass
            await trio.sleep(0.2)
    raise RuntimeError(f"/health not ok after {timeout_s} s")


@asynccontextmanager
async def serve(
    args: Sequence[str] = (),
    *,
    env: dict[str, str] | None = None,
    log: Path,
    wrapper: Sequence[str] = (),
    ready_timeout_s: float = 120.0,
) -> AsyncIterator[Served]:
    """``duplex serve --port P --log-format json ARGS`` (``python WRAPPER serve`` instead of
    ``python -m duplex.cli serve`` when ``wrapper`` is given), with `BASE_ENV` and ``env``
    on top of this environment less its ``DUPLEX_*``; yielded once ``/health`` says ``ok``;
    stopped with SIGINT at exit (its process tree killed after 60 s)."""
    began = time.monotonic()
    launch = partial(
        start_server, ["--log-format", "json", *args], log_path=log,
        env={**BASE_ENV, **(env or {})}, wrapper=wrapper, start_s=ready_timeout_s,
    )  # fmt: skip
    started = await trio.to_thread.run_sync(launch)
    served = Served(started.process, started.port, log, began)
    try:
        await wait_health(served.http, ready_timeout_s, started.process)
        yield served
    finally:
        await trio.to_thread.run_sync(partial(stop_server, started, timeout_s=60))


async def get_json(http: str, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    async with httpx.AsyncClient(timeout=timeout, headers=HEADERS) as client:
        reply = await client.get(http + path)
    try:
        return reply.status_code, reply.json()
    except ValueError:
        return reply.status_code, reply.text


async def metrics(http: str) -> str:
    async with httpx.AsyncClient(timeout=10, headers=HEADERS) as client:
        return (await client.get(http + "/metrics")).text


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of ``name`` samples whose labels include ``labels`` (prometheus_client's parser)."""
    return parse_metrics(text).sum(name, **labels)


async def settle(http: str, *, timeout_s: float = 30.0) -> dict[str, float]:
    """Wait until no session is live and no engine slot is held; returns what was left
    (``live``, ``slots``) when that did not happen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    live = slots = -1.0
    while time.monotonic() < deadline:
        try:
            _, health = await get_json(http, "/health")
            text = await metrics(http)
        except httpx.TransportError:
            await trio.sleep(0.5)
            continue
        live = float(health["sessions"]["live"])
        slots = metric_sum(text, "duplex_engine_live_slots")
        if live == 0 and slots == 0:
            return {"live": 0, "slots": 0}
        await trio.sleep(0.25)
    return {"live": live, "slots": slots}


# -- audio -----------------------------------------------------------------------------


def tone(frames: int, *, amplitude: float = 0.3, start: int = 0, hz: float = 440) -> bytes:
    """PCM16 of a tone, loud enough to count as speech."""
    n = np.arange(start * FRAME, (start + frames) * FRAME)
    return (amplitude * np.sin(2 * np.pi * hz * n / 24000) * 32767).astype("<i2").tobytes()


def silence(frames: int) -> bytes:
    return bytes(2 * FRAME * frames)


def append(pcm: bytes) -> str:
    audio = base64.b64encode(pcm).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio, "sample_rate": 24000})


# -- a recording client ------------------------------------------------------------------


@dataclass
class Client:
    """One JSON WebSocket: every event it got, in order, and how it ended."""

    ws: ClientConnection
    events: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    closed: bool = False

    async def send(self, event: dict[str, Any] | str | bytes) -> bool:
        """Send; ``False`` when the socket is closed."""
        try:
            await self.ws.send(event if isinstance(event, str | bytes) else json.dumps(event))
        except ConnectionClosed as exc:
            self._closed(exc)
            return False
        return True

    def _closed(self, exc: ConnectionClosed) -> None:
        self.closed = True
        self.close_code = exc.rcvd.code if exc.rcvd is not None else None

    async def recv(self, timeout: float) -> dict[str, Any] | None:
        """The next event, or ``None`` when the socket closed (raises ``trio.TooSlowError``
        after ``timeout``)."""
        if self.closed:
            return None
        with trio.fail_after(timeout):
            try:
                message = await self.ws.recv()
            except ConnectionClosed as exc:
                self._closed(exc)
                return None
        event = json.loads(message) if isinstance(message, str) else {"type": "<binary>"}
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float) -> dict[str, Any] | None:
        """Receive until an event of type ``kind``; ``None`` if the socket closed first."""
        with trio.fail_after(timeout):
            while True:
                event = await self.recv(timeout)
                if event is None or event["type"] == kind:
                    return event

    async def stream(self, pcm: bytes) -> bool:
        for i in range(0, len(pcm), 2 * FRAME):
            if not await self.send(append(pcm[i : i + 2 * FRAME])):
                return False
        return True

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@asynccontextmanager
async def client(url: str, *, open_timeout: float = 30.0) -> AsyncIterator[Client]:
    async with connect(url, max_queue=None, max_size=None, open_timeout=open_timeout) as ws:
        yield Client(ws)


def heard(events: Sequence[dict[str, Any]]) -> int:
    """Bytes of response audio in ``events``."""
    return sum(
        len(base64.b64decode(e["delta"])) for e in events if e["type"] == "response.audio.delta"
    )


def scrub_paths(text: str) -> str:
    """``text`` without this machine's paths (tracebacks quoted in a report name files):
    the repository becomes ``<repo>``, the Python environment ``<python>``."""
    for prefix, name in ((str(ROOT), "<repo>"), (sys.prefix, "<python>"),
                         (sys.base_prefix, "<python>")):  # fmt: skip
        text = text.replace(prefix, name)
    return text


def write_report(path: Path, report: dict[str, Any]) -> None:
    """``report`` as JSON, with no absolute path of this machine in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scrub_paths(json.dumps(report, indent=2)) + "\n")
