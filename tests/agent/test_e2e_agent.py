"""The voice agent end to end on CPU, in process: an espeak-ng WAV of speech goes into
``/v1/realtime``; the agent's transcript of it, its reply's transcript and its audio come
back; speech over the reply interrupts it; the history keeps what was sent of it."""

from __future__ import annotations

import base64
from pathlib import Path

import trio
from websockets.trio.client import connect

from duplex.sessions import shard_of
from tests.transport.wsclient import running_server
from tests.wire.test_realtime import check_wire

from .agentkit import HELLO, INTERRUPT, RealtimeSocket, grammar_file, rms, silence, wav_pcm16


def _agent(tmp_path: Path) -> dict[str, object]:
    return {"server.agent": True, "server.agent_asr_grammar": grammar_file(tmp_path)}


async def _session(ws_url: str, nursery: trio.Nursery, ws) -> RealtimeSocket:
    sock = RealtimeSocket(ws)
    nursery.start_soon(sock.pump)
    await sock.until("session.created")
    await sock.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "instructions": "You are a helpful voice assistant.",
                "audio": {"input": {"transcription": {"model": "whisper-1"}}},
            },
        }
    )
    await sock.until("session.updated")
    return sock


async def test_speech_in_transcript_and_spoken_reply_out(tmp_path: Path) -> None:
    async with running_server(**_agent(tmp_path)) as server:
        url = server.http.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, max_queue=None) as ws, trio.open_nursery() as nursery:
            sock = await _session(url, nursery, ws)
            await sock.stream(wav_pcm16("hello.wav") + silence(1200))
            done = await sock.until("response.done")
            nursery.cancel_scope.cancel()
    for event in sock.events:
        check_wire(event, schema="ga", duplex=False)
    (completed,) = sock.of("conversation.item.input_audio_transcription.completed")
    assert completed["transcript"] == HELLO
    deltas = sock.of("conversation.item.input_audio_transcription.delta")
    assert deltas and HELLO.startswith("".join(d["delta"] for d in deltas))
    said = "".join(d["delta"] for d in sock.of("response.output_audio_transcript.delta"))
    assert said == f"You said: {HELLO}."
    audio = b"".join(base64.b64decode(d["delta"]) for d in sock.of("response.output_audio.delta"))
    assert len(audio) > 2 * 24_000 and rms(audio) > 0.01  # seconds of speech, not silence
    assert done["response"]["status"] == "completed"
    assert done["response"]["output"][0]["content"][0]["transcript"] == said


async def test_speech_over_the_reply_interrupts_it(tmp_path: Path) -> None:
    async with running_server(**_agent(tmp_path)) as server:
        url = server.http.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, max_queue=None) as ws, trio.open_nursery() as nursery:
            sock = await _session(url, nursery, ws)
            await sock.stream(wav_pcm16("hello.wav") + silence(800))
            first = await sock.until("response.output_audio.delta")
            index = sock.events.index(first)
            await sock.stream(wav_pcm16("interrupt.wav") + silence(1200))
            done = await sock.until("response.done")
            second = await sock.until("response.done", after=sock.events.index(done) + 1)
            await sock.send(
                {
                    "type": "conversation.item.retrieve",
                    "item_id": done["response"]["output"][0]["id"],
                }
            )
            item = await sock.until("conversation.item.retrieved")
            nursery.cancel_scope.cancel()
    assert index > 0
    for event in sock.events:
        check_wire(event, schema="ga", duplex=False)
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] in ("turn_detected", "barge_in")
    transcripts = sock.of("conversation.item.input_audio_transcription.completed")
    assert [t["transcript"] for t in transcripts] == [HELLO, INTERRUPT]
    said = second["response"]["output"][0]["content"][0]["transcript"]
    assert said == f"You said: {INTERRUPT}."
    heard = item["item"]["content"][0]["transcript"]
    assert heard and f"You said: {HELLO}.".startswith(heard)


async def test_the_agent_answers_on_every_shard_with_engine_processes(tmp_path: Path) -> None:
    """Two session shards behind two workers, the agent's ASR and TTS in the engine process:
    a session on each shard gets its transcript and a spoken reply (each shard runs the
    agent over the engine process's request engines)."""
    layout = {
        "server.connection_workers": 2,
        "server.session_shards": 2,
        "server.engine_process": "on",
    }

    async def turn(sock: RealtimeSocket) -> None:
        await sock.stream(wav_pcm16("hello.wav") + silence(1200))
        await sock.until("response.done")

    async with running_server(**_agent(tmp_path), **layout) as server:
        url = server.http.replace("http://", "ws://") + "/v1/realtime"
        # one after the other: the second session is placed on the roomier shard
        async with connect(url, max_queue=None) as ws0, trio.open_nursery() as pumps0:
            first = await _session(url, pumps0, ws0)
            async with connect(url, max_queue=None) as ws1, trio.open_nursery() as pumps1:
                second = await _session(url, pumps1, ws1)
                with trio.fail_after(120):
                    async with trio.open_nursery() as turns:
                        turns.start_soon(turn, first)
                        turns.start_soon(turn, second)
                pumps1.cancel_scope.cancel()
            pumps0.cancel_scope.cancel()
    socks = [first, second]
    ids = [sock.of("session.created")[0]["session"]["id"] for sock in socks]
    assert sorted(shard_of(i) for i in ids) == [0, 1], ids
    for sock in socks:
        (completed,) = sock.of("conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == HELLO
        said = "".join(d["delta"] for d in sock.of("response.output_audio_transcript.delta"))
        assert said == f"You said: {HELLO}."
