"""The Python client against real servers: ``duplex talk`` from a WAV file against a
``duplex serve`` process, and the library's resume after its socket is cut."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import trio

from duplex.client import RealtimeClient

from ..helpers import ROOT, serve
from ..transport.wsclient import running_server, silence, tone

SPEECH = ROOT / "tests" / "fixtures" / "speech" / "hello.wav"


def test_duplex_talk_holds_a_conversation_from_a_wav(tmp_path: Path) -> None:
    out = tmp_path / "reply.wav"
    with serve(tmp_path) as served:
        ran = subprocess.run(
            [sys.executable, "-m", "duplex.cli", "talk", "--url", served.ws,
             "--wav", str(SPEECH), "--out", str(out)],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        opened = served.metric("duplex_sessions_opened_total")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    agent = [line for line in lines if line.startswith("agent: You said:")]
    assert agent, ran.stdout  # the voice agent (the default) answers what it heard
    summary = lines[-1]
    acks = re.search(r"(\d+) playback acks, (\d+) ms heard by the server", summary)
    assert summary.startswith("# ") and acks and int(acks.group(1)) > 0, summary
    assert int(acks.group(2)) > 0, summary  # the server's ledger holds what was played
    assert opened == 1
    with wave.open(str(out), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        reply = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    assert np.abs(reply).max() > 1000  # the agent's speech, not silence


def test_duplex_talk_says_why_without_a_microphone_or_a_file(tmp_path: Path) -> None:
    # an ALSA configuration whose only device is on a card that does not exist: no sound
    # device, whatever the machine has (an empty file makes PortAudio abort)
    (tmp_path / "asound.conf").write_text("pcm.!default { type hw; card 99 }\n")
    env = {**os.environ, "ALSA_CONFIG_PATH": str(tmp_path / "asound.conf")}
    ran = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "talk", "--url", "ws://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    assert "no microphone" in ran.stderr and "--wav" in ran.stderr
    assert "Traceback" not in ran.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "talk", "--wav", str(tmp_path / "none.wav")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert missing.returncode == 2 and "cannot read" in missing.stderr


async def test_the_client_resumes_its_session_after_the_socket_is_cut() -> None:
    async with (
        running_server(**{"session.false_interruption_enabled": False}) as server,
        RealtimeClient.open(server.http.replace("http://", "ws://")) as client,
    ):
        created = await client.receive()
        assert created.type == "session.created"
        seen: list[int] = []

        async def until_done() -> str:
            while True:
                event = await client.receive()
                if event.seq is not None:
                    seen.append(event.seq)
                if event.type == "response.done":
                    return event.data["response"]["id"]

        for frame in range(0, 6):
            await client.append(tone(1, start=frame))
        await client.append(silence(8))
        with trio.fail_after(30):
            first = await until_done()
        await client.ack(first, 80)
        await client.drop()  # as a network failure: no close frame
        for frame in range(0, 6):  # sent on the resumed socket
            await client.append(tone(1, start=frame))
        await client.append(silence(8))
        with trio.fail_after(30):
            second = await until_done()
    assert second != first
    assert client.reconnects == 1 and client.cursor.resumes == 1
    assert client.session_id == created.data["session"]["id"]
    assert seen == sorted(set(seen))  # each journaled event once, in order
