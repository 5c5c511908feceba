"""What end-to-end tests share, once: a ``duplex serve`` subprocess, its ``/metrics`` read
with prometheus_client's own parser, a free loopback port, and waiting on a condition.

In the manner of h11's ``h11/tests/helpers.py``: one module, so a fix to how a server is
started, stopped or read lands in every test at once. ``bench/_served.py`` builds on it
too (its benches put the repository root on ``sys.path``).

- `serve` (sync) and `served` (async, off the event loop) start ``python -m duplex.cli
  serve`` from this checkout on a free port, wait until ``/health`` answers 200, and stop
  it with SIGINT (the server's graceful stop), killing its process tree if it hangs.
- `Metrics` is one scrape: `Metrics.sum` adds the samples whose labels include the
  ones asked for, `Metrics.one` is the sample with exactly those labels.
- `wait_until` polls a condition under a deadline: what a test waits for is named,
  never guessed with a fixed sleep.
"""

from __future__ import annotations

import contextlib
import http.client
import inspect
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = [
    "HOST",
    "ROOT",
    "Metrics",
    "Served",
    "free_port",
    "parse_metrics",
    "process_tree",
    "scrape",
    "serve",
    "served",
    "start_server",
    "stop_server",
    "wait_until",
]

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the servers run this checkout's code."""
HOST = "127.0.0.1"
"""Tests talk to loopback only."""

_PORT_TAKEN = "cannot serve on"
"""The server's one line when its port was taken (``duplex.cli``)."""
_PORT_TRIES = 3


def free_port() -> int:
    """A loopback port nobody listens on now (the OS's choice). Another process may take
    it before it is used: `start_server` tries again when that happens."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# -- metrics ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metrics:
    """One ``/metrics`` scrape, parsed by prometheus_client (a malformed exposition fails
    the test that reads it). ``text`` is kept for tests that match lines."""

    text: str
    samples: tuple[Sample, ...]

    def sum(self, name: str, **labels: str) -> float:
        """The sum of the ``name`` samples whose labels include ``labels``; 0.0 when none
        (a counter nobody incremented yet)."""
        return float(
            sum(
                s.value
                for s in self.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
            )
        )

    def one(self, name: str, **labels: str) -> float | None:
        """The ``name`` sample whose labels are exactly ``labels``; ``None`` when absent."""
        for s in self.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
        return None

    def names(self) -> set[str]:
        """Every sample name in the scrape."""
        return {s.name for s in self.samples}


def parse_metrics(text: str) -> Metrics:
    """``text`` in the Prometheus text format, parsed."""
    families = text_string_to_metric_families(text)
    return Metrics(text, tuple(s for family in families for s in family.samples))


async def scrape(
    base_url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 30.0
) -> Metrics:
    """``GET /metrics`` of the server at ``base_url`` (``http://host:port``), parsed; the
    answer must be 200. Async, so it also reads an in-process server on this event loop."""
    async with httpx.AsyncClient(timeout=timeout_s, headers=dict(headers or {})) as http:
        reply = await http.get(base_url + "/metrics")
    assert reply.status_code == 200, (reply.status_code, reply.text[:500])
    return parse_metrics(reply.text)


# -- waiting ----------------------------------------------------------------------------


async def wait_until(
    condition: Callable[[], bool] | Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
    poll_s: float = 0.02,
    what: str = "",
) -> None:
    """Return once ``condition()`` (sync or async) is true; fail the test after
    ``timeout_s`` naming ``what``. The timeout bounds a wait for a named condition; it
    is never the synchronisation itself."""
    try:
        with trio.fail_after(timeout_s):
            while True:
                result = condition()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await trio.sleep(poll_s)
    except trio.TooSlowError:
        raise AssertionError(f"not within {timeout_s} s: {what or condition}") from None


# -- a duplex serve subprocess -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Served:
    """A running ``duplex serve`` subprocess on ``HOST:port``, logging to ``log_path``."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        """Everything the server wrote (stdout and stderr), so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def get(
        self, path: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0
    ) -> tuple[int, str]:
        """``GET path``: status and body. Blocking: for sync tests, or an async test
        whose event loop runs no server (this one is another process)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout_s)
        try:
            conn.request("GET", path, headers=dict(headers or {}))
            answer = conn.getresponse()
            return answer.status, answer.read().decode(errors="replace")
        finally:
            conn.close()

    def metrics(self) -> Metrics:
        status, text = self.get("/metrics")
        assert status == 200, (status, text[:500])
        return parse_metrics(text)

    def metric(self, name: str, **labels: str) -> float:
        """`Metrics.sum` of one scrape."""
        return self.metrics().sum(name, **labels)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (workers, shards, engine processes), parents
    first, read from ``/proc``; a zombie (exited, not yet reaped) is not live."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with (
                contextlib.suppress(OSError, IndexError, ValueError),
                open(f"/proc/{entry}/stat") as f,
            ):
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    parents[int(entry)] = int(parent)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += [child for child, parent in parents.items() if parent == current]
    return out


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The test process's environment without its ``DUPLEX_*`` settings (a developer's
    shell must not change what a test serves), this checkout first on the path, then
    ``env``."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_")}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH")) if p)
    out.update(env or {})
    return out


def start_server(
    args: Sequence[str] = (),
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    wrapper: Sequence[str] = (),
    start_s: float = 90.0,
    headers: Mapping[str, str] | None = None,
) -> Served:
    """``python -m duplex.cli serve --port P ARGS`` (``python WRAPPER serve ...`` when a
    ``wrapper`` script is given), once ``/health`` answers 200.

    Args:
        log_path: where its stdout and stderr go (overwritten).
        env: environment variables on top of the test's (``DUPLEX_*`` of the test's own
            environment are dropped).
        python: the interpreter (another environment's, e.g. the one with vllm).
        start_s: how long it may take to answer (a model load counts).
        headers: sent with the ``/health`` probe (a server behind API keys needs its key).

    Raises:
        AssertionError: it exited, or did not answer within ``start_s``; with its log.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    head = [python, *wrapper] if wrapper else [python, "-m", "duplex.cli"]
    for _ in range(_PORT_TRIES):
        port = free_port()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*head, "serve", "--port", str(port), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_environment(env),
                cwd=ROOT,
            )
        served = Served(process, port, log_path)
        deadline = time.monotonic() + start_s
        while served.alive():
            with contextlib.suppress(OSError):
                if served.get("/health", headers=headers)[0] == 200:
                    return served
            if time.monotonic() > deadline:
                stop_server(served)
                raise AssertionError(f"duplex serve not ready in {start_s} s\n{served.log()}")
            time.sleep(0.1)  # polling /health: the next look, not a guess at readiness
        if _PORT_TAKEN not in served.log():
            break  # another process took the free port: try a new one
    raise AssertionError(f"duplex serve exited with {process.returncode}\n{served.log()}")


def stop_server(served: Served, *, timeout_s: float = 30.0) -> int:
    """SIGINT (the server's graceful stop); after ``timeout_s`` SIGKILL to it and every
    process under it. Returns its exit status (negative: the signal that ended it)."""
    if served.alive():
        served.process.send_signal(signal.SIGINT)
        try:
            served.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            for pid in reversed(process_tree(served.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    return served.process.wait()


@contextlib.contextmanager
def serve(
    log_dir: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    start_s: float = 90.0,
    clean_exit: bool = False,
) -> Iterator[Served]:
    """`start_server` with ``log_dir/serve.log``, stopped at the end of the block;
    ``clean_exit``: its exit status must then be 0 (checked when the block succeeded)."""
    served = start_server(
        args, log_path=log_dir / "serve.log", env=env, python=python, start_s=start_s
    )
    try:
        yield served
    except BaseException:
        stop_server(served)
        raise
    status = stop_server(served)
    assert not clean_exit or status == 0, f"exit status {status}\n{served.log()[-4000:]}"


@contextlib.asynccontextmanager
async def served(
    *args: str,
    env: Mapping[str, str] | None = None,
    start_s: float = 90.0,
    clean_exit: bool = True,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[str]:
    """The same server for a trio test, started and stopped off its event loop; yields
    the base URL (``http://127.0.0.1:P``). Its log (JSON lines) lives in a temporary
    folder for the block and is quoted when it fails to start or to exit cleanly."""
    with tempfile.TemporaryDirectory(prefix="duplex-serve-") as folder:
        log_path = Path(folder) / "serve.log"
        launch = partial(
            start_server, ["--log-format", "json", *args], log_path=log_path, env=env,
            start_s=start_s, headers=headers,
        )  # fmt: skip
        server = await trio.to_thread.run_sync(launch)
        try:
            yield server.http
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(stop_server, server)
            raise
        status = await trio.to_thread.run_sync(stop_server, server)
        assert not clean_exit or status == 0, f"exit status {status}\n{server.log()[-4000:]}"
