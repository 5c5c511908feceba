"""The agent's ASR child process is killed mid-turn: the turn still ends (its
transcription ``failed``, as OpenAI's event with an ``error``; the item keeps what was
heard), its reply is not left waiting, and the next turn is heard whole. Real server in
process, real pocketsphinx child, real SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import trio
from openai.types.realtime import ConversationItemInputAudioTranscriptionFailedEvent
from websockets.trio.client import connect

from tests.transport.wsclient import running_server

from .agentkit import HELLO, silence, wav_pcm16
from .test_e2e_agent import _agent, _session

COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


def asr_pids(engine_process: str) -> list[int]:
    """The ASR children: of this process (``off``), or of its engine process (``on``;
    multiprocessing children, ``agent_asr_workers`` of them). Only where asked: a child
    of an earlier test's server in this process may still be alive."""
    if engine_process == "off":
        return [p.pid for p in multiprocessing.active_children() if p.name == "duplex-asr"]
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{ppid}/stat") as f:
                    grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"spawn_main" in cmdline and grandparent == os.getpid():
                found.append(int(entry))
    assert found
    return found


@pytest.mark.parametrize("engine_process", ["off", "on"])
async def test_a_killed_asr_child_ends_the_turn_and_the_next_is_heard(
    tmp_path: Path, engine_process: str
) -> None:
    """``on``: the ASR is a child of the engine process (the request engines run there)."""
    # one ASR child, so the one killed is the one hearing the turn (a second child killed
    # while idle would fail the first chunk it gets next: the next turn's, by chance)
    layout = {"server.engine_process": engine_process, "server.agent_asr_workers": 1}
    async with running_server(**_agent(tmp_path), **layout) as server:
        url = server.http.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, max_queue=None) as ws, trio.open_nursery() as nursery:
            sock = await _session(url, nursery, ws)
            speaking = trio.Event()

            async def speak() -> None:
                await sock.stream(wav_pcm16("hello.wav") + silence(1200))
                speaking.set()

            nursery.start_soon(speak)
            await sock.until("conversation.item.input_audio_transcription.delta")
            (pid,) = asr_pids(engine_process)
            os.kill(pid, signal.SIGKILL)  # mid-turn: the speech has been heard in part
            await speaking.wait()
            failed = await sock.until(FAILED, timeout=30)
            done = await sock.until("response.done", timeout=30)
            after = len(sock.events)
            await sock.stream(wav_pcm16("hello.wav") + silence(1200))
            again = await sock.until(COMPLETED, after=after, timeout=30)
            second = await sock.until("response.done", after=after, timeout=30)
            nursery.cancel_scope.cancel()
    ConversationItemInputAudioTranscriptionFailedEvent.model_validate(failed, strict=True)
    assert failed["error"]["code"] == "transcription_failed"
    assert failed["error"]["type"] == "transcription_error"
    killed_turn = failed["item_id"]
    assert [e for e in sock.events if e["type"] == COMPLETED and e["item_id"] == killed_turn] == []
    assert again["item_id"] != killed_turn
    assert done["response"]["status"] == "completed"
    assert again["transcript"] == HELLO
    assert second["response"]["status"] == "completed"
    said = second["response"]["output"][0]["content"][0]["transcript"]
    assert said == f"You said: {HELLO}."
