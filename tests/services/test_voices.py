"""Uploaded voices: the store (validation, limits both ways, restart) and the routes in
process (httpx's ASGI transport), hostile uploads included."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from duplex.exceptions import ProtocolError
from duplex.metrics import MetricsRegistry
from duplex.models import uploaded_voice_path
from duplex.runtime import RequestEngines
from duplex.services.speech import SpeechService
from duplex.services.voices import VoiceLimits, VoiceService, VoiceStore, voice_routes

VOICES = "/v1/audio/voices"


def wav(
    seconds: float = 1.0,
    rate: int = 24_000,
    channels: int = 1,
    width: int = 2,
    seed: int = 1,
    silent: bool = False,
) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * (180 + 40 * seed) * t)
    if silent:
        tone = tone * 0
    pcm = np.repeat(tone[:, None], channels, axis=1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 1:
            w.writeframes((pcm * 127 + 128).astype(np.uint8).tobytes())
        elif width == 2:
            w.writeframes((pcm * 32767).astype("<i2").tobytes())
        else:
            w.writeframes((pcm * 2**31 * 0.99).astype("<i4").tobytes())
    return out.getvalue()


def refused(call: object, code: str, param: str | None) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        call()  # type: ignore[operator]
    assert (caught.value.code, caught.value.param) == (code, param), caught.value.message
    return caught.value


def test_a_voice_is_stored_listed_and_kept_across_a_restart(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    assert store.list() == []
    stored = store.add("narrator_1", wav(2.0, rate=48_000, channels=2), "Hello there.", 1000)
    assert (stored.sample_rate, round(stored.duration_s, 3)) == (48_000, 2.0)
    again = VoiceStore(tmp_path / "voices")  # a restart: the folder is the state
    assert again.list() == [stored]
    path = uploaded_voice_path(tmp_path / "voices", "narrator_1")
    assert path is not None
    with wave.open(str(path)) as w:  # kept as mono PCM16 at its own rate
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 48_000)
    for width in (1, 4):
        assert again.add(f"w{width}", wav(width=width), None, 1).sample_rate == 24_000
    again.delete("narrator_1")
    assert [v.name for v in VoiceStore(tmp_path / "voices").list()] == ["w1", "w4"]
    refused(lambda: again.delete("narrator_1"), "voice_not_found", "voice_id")


def test_samples_that_are_not_voices_are_refused_naming_the_field(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, VoiceLimits(max_bytes=200_000, max_duration_s=3.0))
    bad = {
        "not audio": b"%PDF-1.4 not audio at all" * 10,
        "empty": b"",
        "a RIFF that is no WAV": b"RIFF\x00\x00\x00\x00WAVEjunk",
        "too long": wav(3.5, rate=16_000),
        "too short": wav(0.2),
        "wrong rate": wav(1.0, rate=8_000),
        "silent": wav(1.0, silent=True),
        "too big": wav(2.5, rate=48_000),
    }
    messages = {}
    for what, data in bad.items():
        messages[what] = refused(
            lambda data=data: store.add("v", data, None, 0), "invalid_value", "audio_sample"
        ).message
    assert "8000 Hz" in messages["wrong rate"] and "3.5 s" in messages["too long"]
    assert "bytes" in messages["too big"]
    assert store.list() == [] and list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.parametrize(
    "name",
    ["../escape", "a/b", "..", ".hidden", "a.b", "x\n", "", "-x", "v" * 65, "C:\\x", "%2e%2e"],
)
def test_path_tricks_in_names_are_refused(tmp_path: Path, name: str) -> None:
    store = VoiceStore(tmp_path / "voices")
    refused(lambda: store.add(name, wav(), None, 0), "invalid_value", "name")
    assert not (tmp_path / "voices").exists()
    assert uploaded_voice_path(tmp_path / "voices", name) is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_a_name_is_a_voice_name_or_never_reaches_the_disk(name: str) -> None:
    """Whatever the name, the path it forms stays one file in the folder, or none is formed."""
    folder = Path("/nonexistent-voices")
    try:
        from duplex.services.voices._store import check_name

        check_name(name)
    except ProtocolError:
        assert uploaded_voice_path(folder, name) is None
        return
    assert (folder / f"{name}.wav").parent == folder and "/" not in name and "." not in name


def test_count_and_name_limits_refuse_and_recover(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, VoiceLimits(max_voices=2))
    store.add("one", wav(seed=1), None, 0)
    refused(lambda: store.add("ONE", wav(seed=2), None, 0), "voice_exists", "name")
    refused(lambda: store.add("Alloy", wav(), None, 0, ("alloy",)), "voice_exists", "name")
    store.add("two", wav(seed=2), None, 0)
    refused(lambda: store.add("three", wav(seed=3), None, 0), "voice_store_full", "name")
    store.delete("one")
    assert store.add("three", wav(seed=3), None, 0).name == "three"
    long_text = "x" * 5000
    refused(lambda: store.add("four", wav(), long_text, 0), "invalid_value", "reference_text")


def app(service: VoiceService | None) -> httpx.AsyncClient:
    routes = voice_routes(service)
    transport = httpx.ASGITransport(app=Starlette(routes=routes))
    return httpx.AsyncClient(transport=transport, base_url="http://voices")


def upload(name: str, data: bytes, **fields: str) -> dict[str, object]:
    return {
        "data": {"name": name, **fields},
        "files": {"audio_sample": ("v.wav", data, "audio/wav")},
    }


async def test_routes_upload_list_delete_and_refuse(
    tmp_path: Path, registry: MetricsRegistry
) -> None:
    store = VoiceStore(tmp_path, VoiceLimits(max_bytes=100_000, max_voices=2))
    service = VoiceService(store, None, registry=registry, wall_clock=lambda: 1234.5)
    async with app(service) as http:
        assert (await http.get(VOICES)).json()["voices"] == []
        made = await http.post(VOICES, **upload("robot", wav(), reference_text="Hi."))  # type: ignore[arg-type]
        assert made.status_code == 200, made.text
        assert made.json() == {
            "id": "robot", "object": "audio.voice", "name": "robot", "type": "audio_sample",
            "created_at": 1234, "duration_s": 1.0, "sample_rate": 24000,
            "reference_text": "Hi.", "uploaded": True,
        }  # fmt: skip
        listed = (await http.get(VOICES)).json()
        assert listed["voices"] == ["robot"] and listed["data"][0]["uploaded"] is True

        async def send(name: str, data: bytes, **fields: str) -> httpx.Response:
            return await http.post(VOICES, **upload(name, data, **fields))  # type: ignore[arg-type]

        async def refuses(response: httpx.Response, status: int, code: str, param: str | None):
            assert response.status_code == status, response.text
            error = response.json()["error"]
            assert (error["code"], error["param"]) == (code, param), error

        await refuses(await send("robot", wav(seed=3)), 409, "voice_exists", "name")
        await refuses(await send("../x", wav()), 400, "invalid_value", "name")
        await refuses(await send("pdf", b"%PDF" * 100), 400, "invalid_value", "audio_sample")
        no_file = await http.post(VOICES, files={"name": (None, "x")})
        await refuses(no_file, 400, "missing_required_parameter", "audio_sample")
        json_body = await http.post(VOICES, json={"name": "x"})
        await refuses(json_body, 400, "invalid_form", "content-type")
        prompt = await send("p", wav(), type="prompt")
        await refuses(prompt, 400, "unsupported_parameter", "type")
        await refuses(await send("p", wav(), color="red"), 400, "unknown_parameter", "color")
        oversized = await send("big", b"RIFF" + b"\0" * 200_000)
        await refuses(oversized, 413, "body_too_large", None)
        two = [("audio_sample", ("a.wav", wav(), "audio/wav"))] * 2
        two_files = await http.post(VOICES, data={"name": "two"}, files=two)
        await refuses(two_files, 400, "invalid_form", None)
        await refuses(await http.delete(VOICES + "/nobody"), 404, "voice_not_found", "voice_id")
        for trick in ("/.hidden", "/a.b", "/..x", "/%00"):
            await refuses(await http.delete(VOICES + trick), 404, "voice_not_found", "voice_id")
        # the session stays usable: a good upload after every refusal, then the cap both ways
        assert (await send("second", wav(seed=2))).status_code == 200
        await refuses(await send("third", wav(seed=4)), 409, "voice_store_full", "name")
        deleted = await http.delete(VOICES + "/robot")
        assert deleted.json() == {"id": "robot", "object": "audio.voice.deleted", "deleted": True}
        assert (await send("third", wav(seed=4))).status_code == 200
        assert (await http.get(VOICES)).json()["voices"] == ["second", "third"]
    text = registry.render()
    assert 'duplex_voice_requests_total{endpoint="create",outcome="refused"} 10\n' in text


async def test_builtin_voices_are_listed_and_a_loading_tts_says_so(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.add("mine", wav(), None, 0)
    speech = SpeechService(RequestEngines(["tts"]), uploaded=store)  # configured, not running
    async with app(VoiceService(store, speech)) as http:
        loading = await http.get(VOICES)
        assert (loading.status_code, loading.json()["error"]["code"]) == (503, "tts_loading")
    async with app(None) as http:
        missing = await http.get(VOICES)
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "voices_not_served")
