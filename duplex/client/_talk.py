"""``duplex talk``: hold one conversation, from a WAV file (or a microphone), print it.

The file is streamed in 80 ms chunks at the pace of a microphone, then silence
follows, as a microphone's would, until the agent has finished answering. The
agent's audio goes through a ``Playout`` (a speaker's timeline), is written
where it played in the output WAV, and every ``ack_interval_s`` the played
position of each response goes back as ``playback.ack``.
"""

from __future__ import annotations

import sys
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trio

from ._connection import RealtimeClient
from ._state import SAMPLE_RATE, Playout, ServerEvent

CHUNK = SAMPLE_RATE * 80 // 1000
"""Samples per append: 80 ms, a model frame."""


def read_wav(path: str | Path) -> np.ndarray:
    """A 16-bit PCM WAV as mono int16 at 24 kHz (channels averaged, rate linearly resampled).

    Raises:
        ValueError: not 16-bit PCM.
    """
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV files are read")
        channels, rate = wav.getnchannels(), wav.getframerate()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    audio = samples.reshape(-1, channels).mean(axis=1)
    if rate != SAMPLE_RATE and len(audio):
        n_out = round(len(audio) * SAMPLE_RATE / rate)
        audio = np.interp(np.arange(n_out) * rate / SAMPLE_RATE, np.arange(len(audio)), audio)
    return np.clip(np.round(audio), -32768, 32767).astype(np.int16)


def write_wav(path: str | Path, pcm: np.ndarray) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(pcm.astype("<i2").tobytes())


@dataclass
class Conversation:
    """What happened: the lines of the transcript, the agent's audio where it played."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    responses: dict[str, str] = field(default_factory=dict)
    """Each response's status at its ``response.done``."""
    acks_sent: int = 0
    acknowledged: int = 0
    """``playback.acknowledged`` events received."""
    reconnects: int = 0
    session_id: str | None = None
    output: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))


@dataclass
class _Talk:
    client: RealtimeClient
    out: Callable[[str], None]
    t0: float
    playout: Playout = field(default_factory=Playout)
    result: Conversation = field(default_factory=Conversation)
    chunks: list[tuple[int, np.ndarray]] = field(default_factory=list)
    transcripts: dict[str, list[str]] = field(default_factory=dict)
    active: str | None = None
    acked: dict[str, int] = field(default_factory=dict)
    last_activity: float = 0.0

    def say(self, role: str, text: str) -> None:
        self.result.lines.append((role, text))
        self.out(f"{role}: {text}")

    def on_event(self, event: ServerEvent, now: float) -> None:
        data, kind = event.data, event.type
        self.last_activity = now
        if kind == "session.created":
            self.result.session_id = data["session"]["id"]
        elif kind == "response.created":
            self.active = data["response"]["id"]
            self.transcripts[self.active] = []
        elif kind in ("response.output_audio.delta", "response.audio.delta"):
            pcm = np.frombuffer(_b64(data["delta"]), "<i2")
            start = self.playout.add(data["response_id"], len(pcm), now)
            self.chunks.append((round((start - self.t0) * SAMPLE_RATE), pcm))
        elif kind in ("response.output_audio_transcript.delta", "response.audio_transcript.delta"):
            self.transcripts.setdefault(data["response_id"], []).append(data["delta"])
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.say("you", data.get("transcript", ""))
        elif kind == "overlap.decision" and data.get("action") == "barge_in":
            self.playout.stop(now)
        elif kind == "response.done":
            response = data["response"]
            rid = response["id"]
            self.result.responses[rid] = response["status"]
            if response["status"] == "cancelled":
                self.playout.stop(now)
            text = "".join(self.transcripts.get(rid, []))
            self.say("agent", f"{text}" + ("" if response["status"] == "completed" else
                                          f" ({response['status']})"))  # fmt: skip
            if self.active == rid:
                self.active = None
        elif kind == "playback.acknowledged":
            self.result.acknowledged += 1
        elif kind == "error":
            error = data.get("error", {})
            self.out(f"error: {error.get('code')}: {error.get('message')}")

    def acks_due(self, now: float) -> list[tuple[str, int]]:
        """Responses whose played position grew since its last ack."""
        due = []
        for rid in list(self.transcripts):
            played = int(self.playout.played_ms(rid, now))
            if played > self.acked.get(rid, 0):
                self.acked[rid] = played
                due.append((rid, played))
        return due

    def audio(self) -> np.ndarray:
        end = max((at + len(pcm) for at, pcm in self.chunks), default=0)
        out = np.zeros(end, np.int32)
        for at, pcm in self.chunks:
            out[at : at + len(pcm)] += pcm
        return np.clip(out, -32768, 32767).astype(np.int16)


async def talk(
    url: str,
    speech: np.ndarray,
    *,
    api_key: str | None = None,
    tail_s: float = 1.5,
    max_s: float = 60.0,
    ack_interval_s: float = 0.2,
    out: Callable[[str], None] = print,
) -> Conversation:
    """Stream ``speech`` (int16, 24 kHz) to the agent at ``url`` and hold the conversation until
    the agent has been quiet for ``tail_s`` after the input ended (at most ``max_s``)."""
    async with RealtimeClient.open(url, api_key=api_key) as client:
        state = _Talk(client, out, trio.current_time())
        input_done = trio.Event()

        async def send_audio() -> None:
            position = 0
            start = trio.current_time()
            while True:
                chunk = speech[position : position + CHUNK]
                if len(chunk) < CHUNK:
                    input_done.set()
                    chunk = np.concatenate([chunk, np.zeros(CHUNK - len(chunk), np.int16)])
                await client.append(chunk.astype("<i2").tobytes())
                position += CHUNK
                await trio.sleep_until(start + position / SAMPLE_RATE)

        async def receive() -> None:
            while True:
                event = await client.receive()
                state.on_event(event, trio.current_time())

        async def ack() -> None:
            while True:
                await trio.sleep(ack_interval_s)
                for rid, played in state.acks_due(trio.current_time()):
                    await client.ack(rid, played)
                    state.result.acks_sent += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_audio)
            nursery.start_soon(receive)
            nursery.start_soon(ack)
            with trio.move_on_after(max_s):
                await input_done.wait()
                state.last_activity = trio.current_time()
                while True:
                    now = trio.current_time()
                    quiet = state.active is None and state.playout.idle(now)
                    if quiet and now - state.last_activity >= tail_s:
                        break
                    await trio.sleep(0.05)
            for rid, played in state.acks_due(trio.current_time()):
                await client.ack(rid, played)
                state.result.acks_sent += 1
            await trio.sleep(0.2)  # the acknowledgements of the last acks
            nursery.cancel_scope.cancel()
        state.result.reconnects = client.reconnects
        state.result.output = state.audio()
        return state.result


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


def microphone_missing() -> str | None:
    """Why the microphone cannot be used here, or ``None`` when it can."""
    try:
        import sounddevice  # type: ignore[import-not-found]  # noqa: F401
    except (ImportError, OSError) as exc:
        return (
            "no microphone support: `duplex talk` without --wav needs the `sounddevice` "
            f"package and a sound device ({exc}); pass --wav FILE to talk from a file"
        )
    return None


def run_talk(url: str, wav: str | None, out_path: str | None, api_key: str | None) -> int:
    """The ``duplex talk`` command; returns the exit status."""
    if wav is None:
        reason = microphone_missing()
        reason = reason or "microphone input is not implemented yet; pass --wav FILE"
        print(f"duplex talk: {reason}", file=sys.stderr)
        return 2
    try:
        speech = read_wav(wav)
    except (OSError, ValueError, EOFError, wave.Error) as exc:
        print(f"duplex talk: cannot read {wav}: {exc}", file=sys.stderr)
        return 2
    try:
        result = trio.run(lambda: talk(url, speech, api_key=api_key))
    except OSError as exc:
        print(f"duplex talk: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if out_path:
        write_wav(out_path, result.output)
    print(
        f"# {len(result.responses)} responses, {result.acks_sent} playback acks, "
        f"{result.reconnects} reconnects, {len(result.output) / SAMPLE_RATE:.2f} s of audio"
        + (f" in {out_path}" if out_path else "")
    )
    return 0
