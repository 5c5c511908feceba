"""``duplex serve --asr DIR`` with a tiny random Whisper (built here, loaded from its folder as
a real checkpoint is): a Realtime client streams an espeak-ng WAV of speech and gets the
agent's transcription as ``conversation.item.input_audio_transcription.delta`` and
``.completed`` events, then the reply to it; every event checked strictly against the
``openai`` SDK's types. The model's words are arbitrary (random weights): what is checked
is that Whisper's transcripts reach the client, not what they say."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio
from websockets.trio.client import connect

from tests.helpers import Served, serve
from tests.wire.test_realtime import check_wire

from .agentkit import silence, wav_pcm16
from .test_e2e_agent import _session
from .tiny_whisper import build

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-whisper-e2e"))


def asr_card(served: Served, timeout_s: float = 60.0) -> dict[str, object]:
    """The ASR's model card once its engine runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = served.get("/v1/models")
        cards = [c for c in json.loads(body)["data"] if c["kind"] == "transcription"]
        if status == 200 and cards and cards[0]["ready"]:
            return cards[0]
        assert time.monotonic() < deadline, body
        time.sleep(0.2)


async def _talk(url: str) -> list[dict[str, object]]:
    async with connect(url, max_queue=None) as ws, trio.open_nursery() as nursery:
        sock = await _session(url, nursery, ws)
        await sock.stream(wav_pcm16("hello.wav") + silence(1200))
        await sock.until("response.done", timeout=60)
        nursery.cancel_scope.cancel()
    return sock.events


@pytest.mark.parametrize("engine_process", ["off", "on"])
def test_serve_with_whisper_sends_transcription_deltas_and_completed(
    tmp_path: Path, tiny_whisper: Path, engine_process: str
) -> None:
    """``on``: the ASR runs in the engine process (its chunks cross the engine link)."""
    args = ("--asr", str(tiny_whisper), "--engine-process", engine_process)
    with serve(tmp_path, *args) as served:
        card = asr_card(served)
        events = trio.run(_talk, served.ws + "/v1/realtime")
        log = served.log()
    assert card["id"] == tiny_whisper.name
    assert f"asr={tiny_whisper}" in log
    for event in events:
        check_wire(event, schema="ga", duplex=False)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, [e for e in events if e["type"] == "error"]
    deltas = [e for e in events if e["type"] == DELTA]
    (completed,) = [e for e in events if e["type"] == COMPLETED]
    assert deltas and all(d["delta"] and d["item_id"] == completed["item_id"] for d in deltas)
    assert kinds.index(DELTA) < kinds.index(COMPLETED)
    transcript = completed["transcript"]
    assert isinstance(transcript, str) and transcript.replace(" ", "").isalpha()
    (done,) = [e for e in events if e["type"] == "response.done"]
    said = done["response"]["output"][0]["content"][0]["transcript"]
    assert said == f"You said: {transcript}."
