"""A real ``duplex serve`` process on a free loopback port, for clients that need one."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return answer.status, answer.read().decode()
        finally:
            conn.close()

    def metric(self, name: str) -> float:
        """One unlabelled sample of ``/metrics``."""
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve(
    tmp_path: Path, *args: str, python: str = sys.executable, start_s: float = 90
) -> Iterator[Served]:
    """``python -m duplex.cli serve`` (this checkout's code), until it answers ``/health``;
    ``python``: the interpreter (another environment's, e.g. the one with vllm)."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [python, "-m", "duplex.cli", "serve", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    served = Served(port, process, log_path)
    try:
        deadline = time.monotonic() + start_s
        while True:
            assert process.poll() is None, served.log()
            with contextlib.suppress(OSError):
                if served.get("/health")[0] == 200:
                    break
            assert time.monotonic() < deadline, "the server did not start\n" + served.log()
            time.sleep(0.2)
        yield served
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        process.kill()
        process.wait()
