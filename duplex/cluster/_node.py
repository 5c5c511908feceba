"""One duplex node: today's one-host server (``duplex serve``) on its own port, owned by a
Ray actor on the machine it serves.

The actor only starts the server, reads its ``/health`` and ``/metrics`` for the
controller's capacity reports, and stops it: sockets go to the server directly,
never through Ray. The server is a child process that dies with the actor
(``PR_SET_PDEATHSIG``), so a node Ray declares dead has no server left behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

import ray

__all__ = ["NodeServer", "ServerReport", "free_port"]

FRAME_S = 0.08
"""The frame period: a step p99 of this much is a step load of 1."""

_STEP_P99 = re.compile(r"^duplex_engine_step_p99_seconds(?:\{[^}]*\})? (\S+)$", re.M)
_REFUSED = re.compile(r"^duplex_sessions_refused_total(?:\{[^}]*\})? (\S+)$", re.M)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover (runs in the child before exec)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()  # its own process group: the node's shards and workers go with it


def free_port(host: str) -> int:
    """A port free on ``host`` now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@final
@dataclass(frozen=True, slots=True)
class ServerReport:
    """What the node's server said: ``exited`` (its exit code) once it is gone, else its
    ``/health`` (``status`` ``""`` when it did not answer: still starting, or stuck)."""

    url: str
    status: str
    live: int
    capacity: int
    step_load: float
    exited: int | None = None
    refused: int = 0
    """Sessions its admission refused so far (``duplex_sessions_refused_total``, summed)."""


class NodeServer:
    """The server of one node (a Ray actor: ``ray.remote(NodeServer)``, one per GPU or host).

    Methods are plain and quick (a Ray actor runs them one at a time): the controller
    calls ``report`` every poll; Ray itself says when the actor (its process, or its
    machine) is gone.
    """

    def __init__(
        self,
        name: str,
        serve_args: Sequence[str] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``duplex serve`` for node ``name`` on ``host``:``port`` (0: a free port),
        with ``serve_args`` (model, layout, limits) and ``env`` added to this environment."""
        self.name = name
        self.host = host
        self.port = port or free_port(host)
        command = [
            sys.executable,
            "-c",
            "import sys; from duplex.cli import main; sys.exit(main())",
            "serve",
            "--host",
            host,
            "--port",
            str(self.port),
            *serve_args,
        ]
        child_env = {**os.environ, **(env or {}), "DUPLEX_NODE_NAME": name}
        self.process = subprocess.Popen(
            command, env=child_env, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL
        )

    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def pid(self) -> int:
        """The server's process id (its process group's too)."""
        return self.process.pid

    def ray_node(self) -> str:
        """The Ray node this actor runs on (a restarted controller takes it back by it)."""
        return str(ray.get_runtime_context().get_node_id())

    def report(self) -> ServerReport:
        """The server's health now (HTTP on this machine, a second at most)."""
        code = self.process.poll()
        if code is not None:
            return ServerReport(self.url(), "", 0, 0, 0.0, exited=code)
        health = _get(self.url() + "/health")
        if health is None:
            return ServerReport(self.url(), "", 0, 0, 0.0)
        try:
            answer: dict[str, Any] = json.loads(health)
            sessions = answer.get("sessions") or {}
            live, capacity = int(sessions.get("live", 0)), int(sessions.get("capacity", 0))
            status = str(answer.get("status", ""))
        except (ValueError, TypeError, AttributeError):
            return ServerReport(self.url(), "", 0, 0, 0.0)
        metrics = (_get(self.url() + "/metrics") or b"").decode("utf-8", "replace")
        steps = [float(value) for value in _STEP_P99.findall(metrics)]
        load = max(steps, default=0.0) / FRAME_S
        refused = int(sum(float(value) for value in _REFUSED.findall(metrics)))
        return ServerReport(self.url(), status, live, capacity, load, refused=refused)

    def stop(self, grace_s: float = 5.0) -> int:
        """Stop the server as SIGTERM does (sockets closed 1001), killed after ``grace_s``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return int(self.process.returncode)


def _get(url: str) -> bytes | None:
    """The body of a GET, any status; ``None`` when it did not answer within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as reply:
            return bytes(reply.read())
    except urllib.error.HTTPError as exc:  # 503 while starting: still an answer
        return bytes(exc.read())
    except (OSError, ValueError):
        return None
