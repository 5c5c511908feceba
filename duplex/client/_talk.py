"""``duplex talk``: hold one conversation, from a WAV file or the microphone, print it.

The user's audio comes from an `AudioSource` (``_audio.py``: a file, or the sound device)
and is sent in 80 ms chunks, never faster than real time. The agent's audio goes into a
`JitterBuffer`, from which an `AudioSink` (a recording for ``--out``, or the speaker) takes
20 ms blocks at the pace of a speaker; every ``ack_interval_s`` the played position of
each response goes back as ``playback.ack``. The transcript is printed line by line as
the turns end. A file's conversation ends once the agent has been quiet for a while
after it; a microphone's when ``stop`` is set (Ctrl-C).
"""

from __future__ import annotations

import base64
import signal
import sys
import wave
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import trio

from ._audio import (
    CHUNK,
    AudioSink,
    AudioSource,
    NoSoundDevice,
    Recording,
    WavSource,
    read_wav,
    sound_device,
    write_wav,
)
from ._connection import RealtimeClient
from ._state import SAMPLE_RATE, JitterBuffer, ServerEvent

BLOCK = SAMPLE_RATE * 20 // 1000
"""Samples per speaker write: 20 ms."""
LEAD = 2 * BLOCK
"""How far ahead of the wall clock the speaker is fed (a device that paces itself blocks
first; one that does not is held to real time by this)."""


@dataclass
class Conversation:
    """What happened: the lines of the transcript and the counts of the summary line."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    responses: dict[str, str] = field(default_factory=dict)
    """Each response's status at its ``response.done``."""
    acks_sent: int = 0
    acknowledged: int = 0
    """``playback.acknowledged`` events received."""
    heard_ms: dict[str, float] = field(default_factory=dict)
    """How much of each response the server counts as played (its ledger, from our acks)."""
    underruns: int = 0
    reconnects: int = 0
    session_id: str | None = None


@dataclass
class _Talk:
    client: RealtimeClient
    out: Callable[[str], None]
    latency: int
    jitter: JitterBuffer = field(default_factory=JitterBuffer)
    result: Conversation = field(default_factory=Conversation)
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
            self.jitter.add(data["response_id"], np.frombuffer(_b64(data["delta"]), "<i2"))
        elif kind in ("response.output_audio_transcript.delta", "response.audio_transcript.delta"):
            self.transcripts.setdefault(data["response_id"], []).append(data["delta"])
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.say("you", data.get("transcript", ""))
        elif kind == "overlap.decision" and data.get("action") == "barge_in":
            self.jitter.stop()
        elif kind == "response.done":
            response = data["response"]
            rid = response["id"]
            self.result.responses[rid] = response["status"]
            self.jitter.end(rid)
            if response["status"] == "cancelled":
                self.jitter.stop()
            self.say_response(rid, response["status"])
            if self.active == rid:
                self.active = None
        elif kind == "playback.acknowledged":
            self.result.acknowledged += 1
            rid, played = data.get("response_id"), data.get("played_ms")
            if isinstance(rid, str) and isinstance(played, int | float):
                self.result.heard_ms[rid] = float(played)
        elif kind == "error":
            error = data.get("error", {})
            self.out(f"error: {error.get('code')}: {error.get('message')}")

    def say_response(self, rid: str, status: str) -> None:
        text = "".join(self.transcripts.get(rid, []))
        self.say("agent", text + ("" if status == "completed" else f" ({status})"))

    def acks_due(self) -> list[tuple[str, int]]:
        """Responses whose played position grew since its last ack."""
        due = []
        for rid in list(self.transcripts):
            played = self.jitter.played(rid, self.latency) * 1000 // SAMPLE_RATE
            if played > self.acked.get(rid, 0):
                self.acked[rid] = played
                due.append((rid, played))
        return due

    def quiet(self) -> bool:
        return self.active is None and self.jitter.depth() == 0


async def talk(
    url: str,
    source: AudioSource,
    sink: AudioSink,
    *,
    api_key: str | None = None,
    stop: trio.Event | None = None,
    tail_s: float = 1.5,
    max_s: float = 60.0,
    ack_interval_s: float = 0.2,
    out: Callable[[str], None] = print,
) -> Conversation:
    """Hold a conversation with the agent at ``url``: ``source`` is said, the replies are played
    into ``sink``. It ends when ``stop`` is set, or (a source that ran out) when the agent has
    been quiet for ``tail_s``; at most ``max_s``."""
    async with RealtimeClient.open(url, api_key=api_key) as client:
        state = _Talk(client, out, sink.latency)
        ended = stop if stop is not None else trio.Event()

        async def send_audio() -> None:
            sent, start = 0, trio.current_time()
            while True:
                chunk = await source.read()
                await client.append(chunk.astype("<i2").tobytes())
                sent += CHUNK
                await trio.sleep_until(start + sent / SAMPLE_RATE)

        async def play() -> None:
            written, start = 0, trio.current_time()
            while True:
                await sink.write(state.jitter.pull(BLOCK))
                written += BLOCK
                await trio.sleep_until(start + (written - LEAD) / SAMPLE_RATE)

        async def receive() -> None:
            while True:
                event = await client.receive()
                state.on_event(event, trio.current_time())

        async def ack() -> None:
            while True:
                await trio.sleep(ack_interval_s)
                await send_acks()

        async def send_acks() -> None:
            for rid, played in state.acks_due():
                await client.ack(rid, played)
                state.result.acks_sent += 1

        async def until_quiet() -> None:
            while not source.exhausted:
                await trio.sleep(0.05)
            state.last_activity = trio.current_time()
            while not (state.quiet() and trio.current_time() - state.last_activity >= tail_s):
                await trio.sleep(0.05)
            ended.set()

        async with trio.open_nursery() as nursery:
            for task in (send_audio, play, receive, ack, until_quiet):
                nursery.start_soon(task)
            with trio.move_on_after(max_s):
                await ended.wait()
            await trio.sleep(state.latency / SAMPLE_RATE)  # what the device still held
            await send_acks()
            await trio.sleep(0.2)  # the acknowledgements of the last acks
            nursery.cancel_scope.cancel()
        if state.active is not None:
            state.say_response(state.active, "stopped")
        state.result.reconnects = client.reconnects
        state.result.underruns = state.jitter.underruns
        return state.result


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


async def _until_interrupted(stop: trio.Event) -> None:
    """Ctrl-C ends the conversation gracefully; a second one aborts it."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()


async def _talk_live(url: str, api_key: str | None, device: str | None) -> Conversation:
    stop = trio.Event()
    with sound_device(device) as (microphone, speaker):
        print(
            f"# listening on the microphone ({microphone.rate} Hz); Ctrl-C ends the conversation",
            file=sys.stderr,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_interrupted, stop)
                result = await talk(
                    url, microphone, speaker, api_key=api_key, stop=stop, max_s=float("inf")
                )
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # one failure: raise it as itself, not in a group
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from group
            raise
        print(
            f"# microphone: {microphone.overflows} overflows; speaker: {speaker.underflows} "
            "underflows (PortAudio's counts)",
            file=sys.stderr,
        )
    return result


def run_talk(
    url: str,
    wav: str | None,
    out_path: str | None,
    api_key: str | None,
    device: str | None = None,
) -> int:
    """The ``duplex talk`` command; returns the exit status."""
    recording = Recording()
    source = None
    if wav is not None:
        try:
            source = WavSource(read_wav(wav))
        except (OSError, ValueError, EOFError, wave.Error) as exc:
            print(f"duplex talk: cannot read {wav}: {exc}", file=sys.stderr)
            return 2
    try:
        if source is None:
            result = trio.run(_talk_live, url, api_key, device)
        else:
            result = trio.run(lambda: talk(url, source, recording, api_key=api_key))
    except NoSoundDevice as exc:
        print(
            f"duplex talk: no microphone: {exc}; pass --wav FILE to talk from a file",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:
        print(f"duplex talk: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C: no transcript, no summary
        print("duplex talk: interrupted", file=sys.stderr)
        return 130
    if out_path:
        write_wav(out_path, recording.audio())
    heard = round(sum(result.heard_ms.values()))
    saved = f", {len(recording.audio()) / SAMPLE_RATE:.2f} s of audio in {out_path}"
    print(
        f"# {len(result.responses)} responses, {result.acks_sent} playback acks, "
        f"{heard} ms heard by the server, {result.underruns} underruns, "
        f"{result.reconnects} reconnects" + (saved if out_path else "")
    )
    return 0
