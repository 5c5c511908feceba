"""``duplex talk`` on a real sound device: PortAudio's ALSA host, with no sound card.

ALSA's ``file`` plugin makes the device: its capture side reads a raw file (the
fixture's speech at 48 kHz, then silence) and its playback side writes what it
plays to another (at 44.1 kHz), both through ``plug`` so the rates are the device's
own and the client resamples both ways. ALSA reads the configuration from
``$HOME/.asoundrc``, so the ``duplex talk`` subprocess gets a ``HOME`` of its own.
The null slave under the file plugin does not pace; the client never reads or
plays faster than real time, so it behaves like a real device.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from duplex.client._audio import read_wav, resample_clip

from ..helpers import ROOT, serve

SPEECH = ROOT / "tests" / "fixtures" / "speech" / "hello.wav"
MIC_RATE, SPEAKER_RATE = 48_000, 44_100

ASOUNDRC = """
pcm.!default {{ type asym; capture.pcm "mic"; playback.pcm "speaker" }}
pcm.mic {{ type plug; slave {{ pcm "micfile"; rate {mic_rate}; format S16_LE; channels 1 }} }}
pcm.micfile {{ type file; slave.pcm null; file "/dev/null"; infile "{infile}"; format raw }}
pcm.speaker {{
    type plug
    slave {{ pcm "speakerfile"; rate {speaker_rate}; format S16_LE; channels 1 }}
}}
pcm.speakerfile {{ type file; slave.pcm null; file "{outfile}"; format raw }}
"""


def _portaudio() -> None:
    try:
        import sounddevice  # noqa: F401
    except (ImportError, OSError) as exc:  # pragma: no cover - the set-up installs both
        pytest.skip(f"needs sounddevice and libportaudio2 (scripts/bootstrap.sh): {exc}")


def _lines(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))


def test_duplex_talk_on_a_microphone_and_a_speaker(tmp_path: Path) -> None:
    _portaudio()
    home = tmp_path / "home"
    home.mkdir()
    mic, played = tmp_path / "mic.raw", tmp_path / "speaker.raw"
    speech = resample_clip(read_wav(SPEECH), 24_000, MIC_RATE)
    silence = np.zeros(40 * MIC_RATE, np.int16)  # past its end the file plugin repeats itself
    np.concatenate([speech, silence]).astype("<i2").tofile(mic)
    (home / ".asoundrc").write_text(
        ASOUNDRC.format(mic_rate=MIC_RATE, speaker_rate=SPEAKER_RATE, infile=mic, outfile=played)
    )
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    with serve(tmp_path) as served:
        talk = subprocess.Popen(
            [sys.executable, "-m", "duplex.cli", "talk", "--url", served.ws],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_lines, args=(talk.stdout, lines), daemon=True)
        reader.start()
        seen: list[str] = []
        deadline = time.monotonic() + 60
        try:
            while not any(line.startswith("agent: You said:") for line in seen):
                assert time.monotonic() < deadline, (seen, served.log())
                assert talk.poll() is None, (seen, talk.stderr.read())  # type: ignore[union-attr]
                with contextlib.suppress(queue.Empty):
                    seen.append(lines.get(timeout=0.5))
            time.sleep(1.0)  # the reply has played: acks go out every 200 ms
            talk.send_signal(signal.SIGINT)  # Ctrl-C: the conversation ends, the socket closes
            rc = talk.wait(30)
        finally:
            if talk.poll() is None:
                talk.kill()
        opened = served.metric("duplex_sessions_opened_total")
    stderr = talk.stderr.read()  # type: ignore[union-attr]
    reader.join(10)  # it read talk's stdout to its end: every line is in ``lines``
    assert not reader.is_alive()
    while not lines.empty():
        seen.append(lines.get())
    assert rc == 0, stderr
    assert f"listening on the microphone ({MIC_RATE} Hz)" in stderr
    assert opened == 1
    summary = seen[-1]
    found = re.search(r"(\d+) playback acks, (\d+) ms heard by the server", summary)
    assert summary.startswith("# ") and found, seen
    acks, heard = int(found.group(1)), int(found.group(2))
    assert acks > 0 and heard > 0, summary  # the server's history keeps what was played
    output = np.fromfile(played, "<i2")
    assert len(output) > SPEAKER_RATE  # the speaker played the whole conversation
    assert np.abs(output).max() > 1000  # the agent's speech reached the device
    assert heard <= 1000 * len(output) / SPEAKER_RATE
