"""The speech endpoints end to end: ``duplex serve`` in a subprocess, httpx and websockets.

Every route's success path with its audio checked (WAV headers, rates, PyAV decoding the
compressed formats), its errors, the stream protocol, a full queue (429 with
``Retry-After``, then recovery), a client that leaves (its work is withdrawn), a server
without a TTS (404 ``tts_not_loaded``) and a VITS checkpoint folder served with ``--tts``.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import trio
from websockets.trio.client import connect

from ..helpers import scrape, serve, served
from ..models.tts.tiny_vits import save_tiny_vits
from .wsclient import running_server

SPEECH = "/v1/audio/speech"
LONG = " ".join(["This sentence keeps the speech engine busy for a while."] * 70)  # 3,990 chars


def wav_of(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        return w.getframerate(), pcm


def decoded(data: bytes) -> tuple[str, int, float]:
    with av.open(io.BytesIO(data)) as file:
        stream = file.streams.audio[0]
        samples = sum(frame.samples for frame in file.decode(stream))
        return stream.codec_context.name, stream.sample_rate, samples / stream.sample_rate


def loud(pcm: np.ndarray) -> bool:
    return bool(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 500)


async def metric(http: httpx.AsyncClient, url: str, name: str, **labels: str) -> float:
    return (await scrape(url)).sum(name, **labels)


def error_of(response: httpx.Response, status: int, param: str | None, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code)
    return str(error["message"])


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One default server for the tests that only ask it for speech and read no absolute
    count: a start costs a torch import, silero and the agent's ASR; the tests that fill
    its queue, count its requests or change its flags start their own."""
    folder = tmp_path_factory.mktemp("speech")
    with serve(folder, "--log-format", "json", clean_exit=True) as server:
        yield server.http


async def test_speech_files_formats_voices_and_errors(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        plain = await http.post(SPEECH, json={"model": "tts-1", "input": "Hello there.",
                                              "voice": "coral"})  # fmt: skip
        assert plain.status_code == 200 and plain.headers["content-type"] == "audio/wav"
        rate, pcm = wav_of(plain.content)
        assert rate == 22050 and 0.5 < pcm.size / rate < 3 and loud(pcm)

        other = await http.post(SPEECH, json={"input": "Hello there.", "voice": "ash"})
        assert wav_of(other.content)[1].tobytes() != pcm.tobytes()  # another voice

        for asked in (8000, 16000, 24000, 48000):
            r = await http.post(SPEECH, json={"input": "Hello there.", "sample_rate": asked})
            got, resampled = wav_of(r.content)
            # espeak carries a little state between calls: lengths agree to a few ms
            assert got == asked
            assert resampled.size == pytest.approx(pcm.size * asked / 22050, rel=0.02)

        raw = await http.post(
            SPEECH, json={"input": "Hello there.", "response_format": "pcm", "sample_rate": 16000}
        )
        assert raw.headers["content-type"] == "audio/pcm"
        assert len(raw.content) / 2 == pytest.approx(pcm.size * 16000 / 22050, rel=0.02)

        for fmt, codec, media in [
            ("flac", "flac", "audio/flac"),
            ("mp3", "mp3float", "audio/mpeg"),
            ("aac", "aac", "audio/aac"),
            ("opus", "opus", "audio/opus"),
        ]:
            r = await http.post(SPEECH, json={"input": "Hello there.", "response_format": fmt})
            assert r.status_code == 200 and r.headers["content-type"] == media
            name, decoded_rate, seconds = decoded(r.content)
            assert name == codec and seconds == pytest.approx(pcm.size / 22050, abs=0.15)
            assert decoded_rate == (48000 if fmt == "opus" else 22050)

        slow = await http.post(SPEECH, json={"input": "Hello there.", "speed": 0.5})
        fast = await http.post(SPEECH, json={"input": "Hello there.", "speed": 2.0})
        assert wav_of(slow.content)[1].size > pcm.size > wav_of(fast.content)[1].size

        voices = (await http.get("/v1/audio/voices")).json()
        assert voices["voices"][:3] == ["alloy", "ash", "ballad"] and "en-us" in voices["voices"]
        assert voices["sample_rate"] == 22050 and "Andy" in voices["variants"]

        for body, param, code in [
            ({"input": "x", "foo": 1}, "foo", "unknown_parameter"),
            ({"input": ""}, "input", "empty_input"),
            ({"input": "x" * 4097}, "input", "string_above_max_length"),
            ({"input": "x", "speed": 9}, "speed", "invalid_value"),
            ({"input": "x", "response_format": "ogg"}, "response_format", "invalid_value"),
            ({"input": "x", "sample_rate": 11025}, "sample_rate", "invalid_value"),
            ({}, "input", "missing_required_parameter"),
        ]:
            error_of(await http.post(SPEECH, json=body), 400, param, code)
        message = error_of(
            await http.post(SPEECH, json={"input": "x", "voice": "orion"}), 400, "voice",
            "invalid_value",
        )  # fmt: skip
        assert "alloy, ash, ballad, coral" in message
        error_of(await http.post(SPEECH, content=b"{"), 400, None, "invalid_json")
        # the TTS by its name in GET /v1/models, and OpenAI's names for it, speak; others: 404
        cards = (await http.get("/v1/models")).json()["data"]
        (served_name,) = [card["id"] for card in cards if card["kind"] == "speech"]
        assert served_name == "espeak"
        for model in (served_name, "tts-1-hd", "gpt-4o-mini-tts"):
            named = await http.post(SPEECH, json={"model": model, "input": "Hello there."})
            assert named.status_code == 200, (model, named.text)
        message = error_of(
            await http.post(SPEECH, json={"model": "tts-2", "input": "x"}), 404, "model",
            "model_not_found",
        )  # fmt: skip
        assert message == (
            "The model 'tts-2' is not served here; this server serves 'espeak' (OpenAI's names "
            "tts-1, tts-1-hd, gpt-4o-mini-tts are accepted as aliases)."
        )
        # answered before its body is read and its connection closed: a client of its own,
        # so the next request never goes out on that connection ("Server disconnected")
        async with httpx.AsyncClient(base_url=url) as once:
            too_big = await once.post(SPEECH, content=b" " * (3 * 1024 * 1024))
        assert too_big.status_code == 413
        assert (await http.get(SPEECH)).status_code == 405
        ok = await http.post(SPEECH, json={"input": "Still fine."})  # usable after all that
        assert ok.status_code == 200
        assert await metric(http, url, "duplex_speech_requests_total", outcome="invalid") >= 9


async def test_the_openai_sdk_speaks_with_every_voice_of_its_speech_endpoint(url: str) -> None:
    """OpenAI's client, unchanged: its speech voices include three the Realtime sessions lack
    (``fable``, ``onyx``, ``nova``); each speaks, and no two sound the same."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    spoken = {}
    for voice in ("alloy", "fable", "onyx", "nova"):
        answer = await client.audio.speech.create(
            model="tts-1", voice=voice, input="Hello there.", response_format="wav"
        )
        rate, pcm = wav_of(answer.content)
        assert rate == 22050 and loud(pcm), voice
        spoken[voice] = pcm.tobytes()
    assert len(set(spoken.values())) == 4
    await client.close()


async def test_streams_over_http_and_batches_in_input_order(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        text = "First sentence here. A second one follows. And a third."
        whole = wav_of((await http.post(SPEECH, json={"input": text})).content)[1]
        async with http.stream(
            "POST", SPEECH, json={"input": text, "stream": True, "sample_rate": 24000}
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "audio/wav"
            assert "content-length" not in response.headers  # sent as it is made
            chunks = [chunk async for chunk in response.aiter_raw()]
        data = b"".join(chunks)
        assert data[:4] == b"RIFF" and struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
        assert struct.unpack("<I", data[24:28])[0] == 24000
        streamed = np.frombuffer(data[44:], "<i2")
        assert streamed.size / 24000 == pytest.approx(whole.size / 22050, rel=0.05)
        opus = await http.post(
            SPEECH, json={"input": text, "stream": True, "response_format": "opus"}
        )
        assert decoded(opus.content)[0] == "opus"
        error_of(
            await http.post(SPEECH, json={"input": "x", "stream": True, "response_format": "mp3"}),
            400, "response_format", "invalid_value",
        )  # fmt: skip

        inputs = ["A long first input, with quite a few words in it.", "Short.", "Medium one."]
        response = await http.post(
            SPEECH + "/batch",
            json={"input": inputs, "voice": "marin", "response_format": "wav", "model": "tts-1-hd"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "tts-1-hd"  # the name the client sent, echoed
        data = response.json()["data"]
        assert [item["index"] for item in data] == [0, 1, 2]
        lengths = []
        for item, text in zip(data, inputs, strict=True):
            rate, pcm = wav_of(base64.b64decode(item["audio"]))
            assert rate == item["sample_rate"] == 22050 and loud(pcm)
            alone = await http.post(SPEECH, json={"input": text, "voice": "marin"})
            assert pcm.size == pytest.approx(wav_of(alone.content)[1].size, abs=300)
            lengths.append(pcm.size)
        assert lengths[1] < lengths[2] < lengths[0]
        error_of(
            await http.post(SPEECH + "/batch", json={"input": ["ok", ""]}),
            400, "input[1]", "empty_input",
        )  # fmt: skip
        error_of(
            await http.post(SPEECH + "/batch", json={"input": ["ok"], "model": "dall-e-3"}),
            404, "model", "model_not_found",
        )  # fmt: skip


async def test_the_speech_stream_socket(url: str) -> None:
    ws_url = url.replace("http://", "ws://") + SPEECH + "/stream"
    async with connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "input.text", "text": "early"}))
        assert json.loads(await ws.recv())["code"] == "config_required"
        await ws.send(json.dumps({"type": "session.config", "model": "whisper-1"}))
        refused = json.loads(await ws.recv())
        assert (refused["type"], refused["code"]) == ("error", "model_not_found")
        assert "this server serves 'espeak'" in refused["message"]
        config = {"type": "session.config", "voice": "sage", "response_format": "wav",
                  "sample_rate": 16000, "model": "gpt-4o-mini-tts"}  # fmt: skip
        await ws.send(json.dumps(config))
        for piece in ["Hello the", "re. How are", " you today? Fine"]:
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await ws.send(json.dumps({"type": "input.done"}))
        sentences = []
        for index in range(3):
            start = json.loads(await ws.recv())
            assert start["type"] == "audio.start" and start["sentence_index"] == index
            assert (start["utterance_index"], start["format"]) == (0, "wav")
            rate, pcm = wav_of(await ws.recv())
            assert rate == start["sample_rate"] == 16000 and loud(pcm)
            done = json.loads(await ws.recv())
            assert done == {"type": "audio.done", "utterance_index": 0, "sentence_index": index}
            sentences.append(start["sentence_text"])
        assert sentences == ["Hello there.", "How are you today?", "Fine"]
        assert json.loads(await ws.recv()) == {
            "type": "session.done", "utterance_index": 0, "total_sentences": 3,
        }  # fmt: skip
        await ws.send("{not json")
        assert json.loads(await ws.recv())["code"] == "invalid_json"
        # the stream's own text limit (under the frame limit): refused, and the stream
        # goes on (the next utterance below is spoken)
        await ws.send(json.dumps({"type": "input.text", "text": "a" * (128 * 1024 + 1)}))
        assert json.loads(await ws.recv())["code"] == "text_too_large"
        await ws.send(json.dumps({"type": "session.config", "response_format": "flac"}))
        await ws.send(json.dumps({"type": "input.text", "text": "Next one."}))
        await ws.send(json.dumps({"type": "input.done"}))
        start = json.loads(await ws.recv())
        assert (start["utterance_index"], start["format"]) == (1, "flac")
        assert decoded(await ws.recv())[:2] == ("flac", 22050)
        assert json.loads(await ws.recv())["type"] == "audio.done"
        assert json.loads(await ws.recv())["type"] == "session.done"
        await ws.send(json.dumps({"type": "session.close"}))
        await ws.wait_closed()
        assert ws.close_code == 1000


async def test_a_full_queue_refuses_429_then_recovers_and_a_client_that_leaves_frees_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "duplex.toml"
    # LONG at speed 0.25 is about 1,330 s of audio by the estimate: past the 600 s ceiling
    config.write_text("[server]\ntts_max_batch = 1\ntts_max_queue = 1\nspeech_max_audio_s = 3600\n")
    async with (
        served("--config", str(config)) as url,
        httpx.AsyncClient(base_url=url, timeout=120) as http,
    ):
        statuses: list[int] = []
        retry_after: list[str] = []

        async def one() -> None:
            r = await http.post(
                SPEECH, json={"input": LONG, "speed": 0.25, "response_format": "pcm"}
            )
            statuses.append(r.status_code)
            if r.status_code == 429:
                retry_after.append(r.headers["retry-after"])
                assert r.json()["error"]["code"] == "rate_limit_exceeded"

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        assert statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
        assert all(int(value) >= 1 for value in retry_after)
        assert (await http.post(SPEECH, json={"input": "Recovered."})).status_code == 200

        # a client that sends a long request and leaves: its work is withdrawn
        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"input": LONG, "speed": 0.25}).encode()
        batches = await metric(http, url, "duplex_request_batches_total", runner="tts")
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: " + f"{host}:{port}".encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body
        )  # fmt: skip
        with trio.fail_after(60):  # its batch is running (a loaded host may take a while)
            while await metric(http, url, "duplex_request_batches_total", runner="tts") <= batches:
                await trio.sleep(0.05)
        await stream.aclose()

        async def withdrawn() -> float:  # stopped at its next sentence, or left the queue
            return await metric(
                http, url, "duplex_request_batches_stopped_total", runner="tts"
            ) + await metric(http, url, "duplex_requests_cancelled_total", runner="tts")

        # the route counts the request cancelled when the client goes; the engine stops its
        # batch at the next sentence, a moment later: wait for both
        with trio.fail_after(60):
            while await metric(http, url, "duplex_speech_requests_total", outcome="cancelled") < 1:
                await trio.sleep(0.1)
            while await withdrawn() < 1:
                await trio.sleep(0.05)
        assert (await http.post(SPEECH, json={"input": "Still serving."})).status_code == 200


async def test_without_a_tts_every_speech_route_says_so() -> None:
    async with (
        served("--tts", "none", "--no-agent") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        for response in [
            await http.post(SPEECH, json={"input": "x"}),
            await http.post(SPEECH + "/batch", json={"input": ["x"]}),
        ]:
            message = error_of(response, 404, None, "tts_not_loaded")
            assert "--tts espeak" in message
        voices = (await http.get("/v1/audio/voices")).json()  # the uploaded ones only
        assert (voices["sample_rate"], voices["data"]) == (None, [])
        async with connect(url.replace("http://", "ws://") + SPEECH + "/stream") as ws:
            assert json.loads(await ws.recv())["code"] == "tts_not_loaded"
            await ws.wait_closed()


async def test_a_vits_checkpoint_folder_serves(tmp_path: Path) -> None:
    folder = save_tiny_vits(tmp_path / "vits", seed=1, speakers=2)
    async with (
        served("--tts", str(folder)) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        r = await http.post(SPEECH, json={"input": "Hello there.", "voice": "speaker-1"})
        rate, pcm = wav_of(r.content)
        assert r.status_code == 200 and rate == 16000 and pcm.size > 0
        batch = await http.post(SPEECH + "/batch", json={"input": ["One.", "Two two."]})
        assert [item["sample_rate"] for item in batch.json()["data"]] == [16000, 16000]
        voices = (await http.get("/v1/audio/voices")).json()["voices"]
        assert "speaker-1" in voices and "alloy" in voices
        error_of(await http.post(SPEECH, json={"input": "x", "voice": "en-us"}), 400, "voice",
                 "invalid_value")  # fmt: skip
        # the checkpoint is served by its folder's name (its card's), and espeak's is refused
        cards = (await http.get("/v1/models")).json()["data"]
        assert [card["id"] for card in cards if card["kind"] == "speech"] == ["vits"]
        named = await http.post(SPEECH, json={"input": "Hello.", "model": "vits"})
        assert named.status_code == 200, named.text
        message = error_of(await http.post(SPEECH, json={"input": "x", "model": "espeak"}), 404,
                           "model", "model_not_found")  # fmt: skip
        assert "this server serves 'vits'" in message


async def test_streaming_clients_that_leave_stop_their_sentences(tmp_path: Path) -> None:
    sentences = LONG.count(".")
    config = tmp_path / "duplex.toml"
    config.write_text("[server]\nspeech_max_audio_s = 3600\n")  # LONG at 0.25: ~1,330 s
    async with (
        served("--config", str(config)) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        body = {"input": LONG, "speed": 0.25, "stream": True, "response_format": "pcm"}
        async with http.stream("POST", SPEECH, json=body) as response:
            assert response.status_code == 200
            async for _ in response.aiter_raw():
                break  # the first sentence's audio, then leave
        with trio.fail_after(60):
            while await metric(http, url, "duplex_speech_requests_total",
                               endpoint="speech_stream", outcome="cancelled") < 1:  # fmt: skip
                await trio.sleep(0.1)
        submitted = await metric(http, url, "duplex_requests_total", runner="tts")
        assert submitted < sentences  # it stopped: each sentence is one request

        async with connect(url.replace("http://", "ws://") + SPEECH + "/stream") as ws:
            await ws.send(json.dumps({"type": "session.config", "speed": 0.25}))
            await ws.send(json.dumps({"type": "input.text", "text": LONG}))
            await ws.send(json.dumps({"type": "input.done"}))
            assert json.loads(await ws.recv())["type"] == "audio.start"
        with trio.fail_after(60):
            while await metric(http, url, "duplex_speech_requests_total",
                               endpoint="speech_stream_ws", outcome="cancelled") < 1:  # fmt: skip
                await trio.sleep(0.1)
        assert (
            await metric(http, url, "duplex_requests_total", runner="tts") < submitted + sentences
        )
        assert (await http.post(SPEECH, json={"input": "Still serving."})).status_code == 200


async def test_audio_is_resampled_and_encoded_off_the_sessions_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long clip's encode takes hundreds of milliseconds (MP3, Opus): on the event loop it
    held every session's ticks. Every route's resampling and encoding runs in a worker
    thread (in process, so the calls can be watched)."""
    from duplex.services.speech import _serving as _speech

    on_loop: list[tuple[str, bool]] = []

    def watched(name: str, work: Any) -> Any:
        def call(*args: Any) -> Any:
            on_loop.append((name, trio.lowlevel.in_trio_run()))
            return work(*args)

        return call

    class WatchedStream(_speech.AudioStream):
        def chunk(self, pcm: np.ndarray) -> bytes:
            return watched("chunk", super().chunk)(pcm)

        def end(self) -> bytes:
            return watched("end", super().end)()

    monkeypatch.setattr(_speech, "encode_audio", watched("encode", _speech.encode_audio))
    monkeypatch.setattr(_speech, "resample_pcm16", watched("resample", _speech.resample_pcm16))
    monkeypatch.setattr(_speech, "AudioStream", WatchedStream)
    async with (
        running_server(**{"server.tts": "espeak"}) as server,
        httpx.AsyncClient(base_url=server.http, timeout=60) as http,
    ):
        text = "Hello there. How are you?"
        mp3 = await http.post(SPEECH, json={"input": text, "response_format": "mp3"})
        assert decoded(mp3.content)[0] == "mp3float"
        opus = await http.post(
            SPEECH, json={"input": text, "stream": True, "response_format": "opus"}
        )
        assert decoded(opus.content)[0] == "opus"
        batch = await http.post(
            SPEECH + "/batch", json={"input": [text], "response_format": "flac"}
        )
        assert batch.status_code == 200, batch.text
        async with connect(server.http.replace("http://", "ws://") + SPEECH + "/stream") as ws:
            await ws.send(json.dumps({"type": "session.config", "sample_rate": 16000}))
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
            kinds = [json.loads(await ws.recv())["type"], type(await ws.recv())]
            assert kinds == ["audio.start", bytes]
    names = {name for name, _ in on_loop}
    assert names == {"encode", "resample", "chunk", "end"}
    assert not [call for call in on_loop if call[1]], on_loop
