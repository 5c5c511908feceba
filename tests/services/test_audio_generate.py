"""``POST /v1/audio/generate``: the body's checks (hostile values included, and with
hypothesis) and the route over a real request engine on the tiny Stable Audio, in process."""

from __future__ import annotations

import io
import json
import math
import wave
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import torch
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from duplex.exceptions import ProtocolError
from duplex.models import ModelOptions, RequestEngine
from duplex.models.diffusion import load_audio_runner, resolve_diffusion
from duplex.runtime import RequestEngines
from duplex.services.media import MediaLimits, MediaService, audio_routes
from duplex.services.media._audio import parse_audio_request

GENERATE = "/v1/audio/generate"
ASK = {"input": "rain on a tin roof", "audio_length": 1.0, "num_inference_steps": 2, "seed": 7}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models are all overhead: more torch threads only contend on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def parse(**body: object) -> object:
    return parse_audio_request(json.dumps(body).encode(), "tiny-audio", 16.0, MediaLimits())


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({**ASK, "audio_length": 36_000}, "audio_length", "invalid_value"),  # ten hours
        ({**ASK, "audio_length": 16.5}, "audio_length", "invalid_value"),  # past the model's
        ({**ASK, "audio_length": 0}, "audio_length", "invalid_value"),
        ({**ASK, "audio_length": -1}, "audio_length", "invalid_value"),
        ({**ASK, "audio_length": 10**400}, "audio_length", "invalid_value"),
        ({**ASK, "audio_length": "5"}, "audio_length", "invalid_type"),
        ({**ASK, "input": ""}, "input", "invalid_value"),
        ({**ASK, "input": 5}, "input", "invalid_type"),
        ({"audio_length": 1}, "input", "missing_required_parameter"),
        ({**ASK, "prompt": "x"}, "prompt", "unknown_parameter"),
        ({**ASK, "response_format": "ogg"}, "response_format", "unsupported_parameter"),
        ({**ASK, "seed": -1}, "seed", "invalid_value"),
        ({**ASK, "seed": 2**64}, "seed", "invalid_value"),
        ({**ASK, "num_inference_steps": 0}, "num_inference_steps", "invalid_value"),
        ({**ASK, "guidance_scale": 1e9}, "guidance_scale", "invalid_value"),
        ({**ASK, "model": "stable-audio-open"}, "model", "model_not_found"),
        ({**ASK, "model": "tts-1"}, "model", "model_not_found"),  # no OpenAI alias here
    ],
)
def test_every_bad_field_is_refused_by_name(body: dict[str, object], param: str, code: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse(**body)
    assert (refused.value.param, refused.value.code) == (param, code), refused.value.message


def test_nan_and_non_objects_are_refused() -> None:
    for body, param in ((b'{"input": "x", "audio_length": NaN}', "audio_length"),
                        (b"[1]", None), (b"{", None)):  # fmt: skip
        with pytest.raises(ProtocolError) as refused:
            parse_audio_request(body, "tiny-audio", 16.0, MediaLimits())
        assert refused.value.param == param


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["input", "audio_length", "seed", "response_format",
                                        "num_inference_steps", "guidance_scale", "x"]),
                       st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                       max_size=6))  # fmt: skip
def test_any_body_is_a_request_within_bounds_or_a_refusal(body: dict[str, object]) -> None:
    try:
        asked = parse_audio_request(json.dumps(body).encode(), "tiny-audio", 16.0, MediaLimits())
    except ProtocolError as refused:
        assert refused.status_hint in (400, 404)
        return
    assert 0.1 <= asked.seconds <= 16.0 and math.isfinite(asked.seconds)
    assert asked.prompt.strip() and asked.steps >= 1


@asynccontextmanager
async def served_audio(cache: Path) -> AsyncIterator[httpx.AsyncClient]:
    engines = RequestEngines(["audio"])
    service = MediaService(engines)
    app = Starlette(routes=audio_routes(service))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://media") as http:
        starting = await http.post(GENERATE, json=ASK)
        assert (starting.status_code, starting.json()["error"]["code"]) == (503, "model_starting")
        model = resolve_diffusion("tiny", "audio", ModelOptions(cache_dir=cache))
        runner = await trio.to_thread.run_sync(load_audio_runner, model, "cpu")
        engine = RequestEngine(runner, max_wait_s=0.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engines.started(engine)
            yield http
            nursery.cancel_scope.cancel()


async def test_generates_each_format_and_a_seed_gives_the_same_bytes(tmp_path: Path) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=Starlette(routes=audio_routes(None))),
        base_url="http://media",
    ) as bare:
        missing = await bare.post(GENERATE, json=ASK)
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_loaded")
        assert "--audio-model" in missing.json()["error"]["message"]
    async with served_audio(tmp_path) as http:
        first = await http.post(GENERATE, json=ASK)
        assert first.status_code == 200, first.text
        assert (first.headers["content-type"], first.headers["x-seed"]) == ("audio/wav", "7")
        with wave.open(io.BytesIO(first.content)) as w:
            assert (w.getframerate(), w.getnframes(), w.getnchannels()) == (8000, 8000, 1)
        again = await http.post(GENERATE, json=ASK)
        assert again.content == first.content
        other = await http.post(GENERATE, json={**ASK, "seed": 8})
        assert other.content != first.content
        drawn = await http.post(GENERATE, json={k: v for k, v in ASK.items() if k != "seed"})
        assert int(drawn.headers["x-seed"]) >= 0
        for fmt, codec, rate in (("mp3", "mp3float", 8000), ("flac", "flac", 8000),
                                 ("opus", "opus", 48000)):  # fmt: skip
            answer = await http.post(GENERATE, json={**ASK, "response_format": fmt})
            assert answer.status_code == 200, answer.text
            with av.open(io.BytesIO(answer.content)) as file:
                stream = file.streams.audio[0]
                assert (stream.codec_context.name, stream.sample_rate) == (codec, rate)
                samples = sum(frame.samples for frame in file.decode(stream))
            assert samples / rate == pytest.approx(1.0, abs=0.1)
        ten_hours = await http.post(GENERATE, json={**ASK, "audio_length": 36_000})
        error = ten_hours.json()["error"]
        assert (ten_hours.status_code, error["param"]) == (400, "audio_length")
        assert "16.384" in error["message"]  # the pipeline's own cap, below the config's
        huge = await http.post(GENERATE, content=b" " * (2 << 20))
        assert huge.status_code == 413
        pcm = await http.post(GENERATE, json={**ASK, "response_format": "pcm"})
        assert np.frombuffer(pcm.content, "<i2").size == 8000  # and still serving
