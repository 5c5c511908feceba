"""The runbook's commands on one host, each in its own process as an operator runs them:
``duplex cluster head --loopback --nodes 2``, ``nodes``, ``ingress`` (HTTP and a session
routed through it), ``drain``, ``down``.

Ray's token authentication is on (a token in the operator's ``~/.ray``, here a HOME of
the test's own), so every command that connects must send it: Ray 2.60's ``ray start``
turns it on when it finds a token, and a driver connecting later does not by itself.
The head's Ray processes (one process group) are killed at the end, not ``ray stop``ped:
that would stop every Ray of this user, the other tests' clusters too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from duplex.cluster import LOOPBACK_ENV, node_of_object

from ..helpers import free_port, process_tree
from .test_e2e_ray import wait_until

DUPLEX = Path(sys.executable).with_name("duplex")


def _cmdlines() -> dict[int, list[str]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                out[int(entry)] = f.read().decode(errors="replace").split("\0")
    return out


def kill_ray_head(port: int) -> None:
    """The Ray processes of the head on ``port``: its process group (the GCS, the raylet,
    Ray's monitors) and everything under them (the node actors, in groups of their own,
    and their servers)."""
    groups = set()
    for pid, cmdline in _cmdlines().items():
        if f"--gcs_server_port={port}" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
    groups.discard(os.getpgid(0))  # never the test's own (`cluster` starts a session each)
    doomed: set[int] = set()
    for pid in _cmdlines():
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) in groups:
                doomed.update(process_tree(pid))
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def operator_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], int]]:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {**os.environ, **LOOPBACK_ENV, "HOME": str(home)}
    env.pop("RAY_AUTH_MODE", None)
    port = free_port()
    try:
        yield env, port
    finally:
        kill_ray_head(port)


def cluster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``duplex cluster ARGS`` in a session of its own, as from an operator's shell (so
    the Ray head it may start is a process group of its own too)."""
    command = [str(DUPLEX), "cluster", *args]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, start_new_session=True
    )


def nodes(env: dict[str, str], address: str) -> dict[str, str]:
    """``duplex cluster nodes``: each node's name and state."""
    listed = cluster(env, "nodes", "--loopback", "--address", address)
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    return {row[0]: row[1] for row in rows}


def test_the_runbook_runs_a_one_host_cluster(operator_env: tuple[dict[str, str], int]) -> None:
    env, port = operator_env
    address = f"127.0.0.1:{port}"
    head = cluster(
        env, "head", "--loopback", "--port", str(port), "--nodes", "2",
        "--", "--no-agent", "--tts", "none",
    )  # fmt: skip
    assert head.returncode == 0, head.stderr[-3000:]
    assert f"nodes join with --address HOST:{port}" in head.stdout
    http_port = free_port()
    ingress = subprocess.Popen(
        [str(DUPLEX), "cluster", "ingress", "--loopback", "--address", address,
         "--port", str(http_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{http_port}"

        def states() -> dict[str, str]:
            """Each node's state, as the ingress has it ({} until it answers)."""
            try:
                listed = httpx.get(base + "/health", timeout=2).json()["nodes"]
            except (httpx.TransportError, json.JSONDecodeError):
                assert ingress.poll() is None, ingress.stdout.read() if ingress.stdout else ""
                return {}
            return {n["node"]: n["state"] for n in listed}

        wait_until("two serving nodes", lambda: list(states().values()) == ["serving"] * 2, 90)
        names = sorted(states())
        assert nodes(env, address) == dict.fromkeys(names, "serving")  # the CLI's listing
        assert httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"] == "loopback"
        # a session through the ingress: its id names the node it was placed on
        with connect(base.replace("http", "ws", 1) + "/v1/duplex", open_timeout=30) as ws:
            ws.send(json.dumps({"type": "session.create"}))
            created = json.loads(ws.recv(timeout=30))
            assert created["type"] == "session.created", created
            assert node_of_object(created["session"]["id"]) in names
            ws.send(json.dumps({"type": "session.close"}))

        drained = cluster(env, "drain", names[0], "--loopback", "--address", address)
        assert drained.returncode == 0 and f"{names[0]} drains" in drained.stdout
        # no session on it: it stops at once; the other serves on
        wait_until("the drained node gone", lambda: states().get(names[0], "gone") == "gone", 90)
        assert states()[names[1]] == "serving"
    finally:
        ingress.send_signal(signal.SIGINT)
        try:
            ingress.wait(15)
        except subprocess.TimeoutExpired:
            ingress.kill()
            ingress.wait()
    down = cluster(env, "down", "--loopback", "--address", address)
    assert down.returncode == 0 and "nodes and controller stopped" in down.stdout
