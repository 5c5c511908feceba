"""Kyutai's real ``moshi.client`` (moshi 0.2.13) talks to our ``/api/chat``.

It runs in its own environment (``scripts/moshi_client_venv.sh`` builds it; this test
skips without it), headless: its sounddevice streams are fakes that play a tone in and
take the audio out at the client's own 80 ms cadence (``moshi_client_peer.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio

from .wsclient import running_server

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("DUPLEX_MOSHI_VENV", ROOT / "build" / "moshi-venv"))
PYTHON = VENV / "bin" / "python"
PEER = Path(__file__).with_name("moshi_client_peer.py")


def _usable() -> bool:
    if not PYTHON.is_file():
        return False
    probe = subprocess.run(
        [str(PYTHON), "-c", "import moshi.client"], capture_output=True, timeout=120
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _usable(), reason="no moshi 0.2.13 environment (scripts/moshi_client_venv.sh)"
)


async def test_moshi_client_streams_both_ways_and_prints_text() -> None:
    async with running_server(**{"server.model": "loopback"}) as server:
        port = urlsplit(server.http).port
        done = await trio.run_process(
            [str(PYTHON), str(PEER), str(port), "4"],
            capture_stdout=True,
            capture_stderr=True,
            env={**os.environ, "PYTHONPATH": ""},  # its own packages only
        )
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["ended"] == "timeout"  # the server kept the conversation open
    assert "Lost connection" not in result["log"]
    assert "unknown message kind 0" in result["log"]  # it does not wait for the handshake
    assert "unknown message kind" not in result["log"].replace("kind 0", "")
    assert result["played_frames"] >= 30  # about 4 s at 80 ms
    assert result["loud_frames"] >= 10  # the loopback's echo of its tone, played back
    assert "[" in result["text"]  # the loopback's text marks, printed as tokens
