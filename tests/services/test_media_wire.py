"""The image and video request parsers: every field's range refused and accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.exceptions import ProtocolError
from duplex.refusals import Refusal
from duplex.services.media._protocol import (
    MediaLimits,
    parse_image_request,
    parse_realtime_video_start,
    parse_video_request,
)

LIMITS = MediaLimits()


def image(**fields: Any) -> bytes:
    return json.dumps({"prompt": "a cat", **fields}).encode()


def refused(call: Any, *args: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        call(*args)
    return caught.value


def test_image_defaults_and_fields() -> None:
    asked = parse_image_request(image(), "m", LIMITS)
    assert (asked.width, asked.height, asked.n, asked.seed, asked.steps) == (512, 512, 1, None, 20)
    asked = parse_image_request(
        image(
            size="64x48",
            n=3,
            seed=7,
            num_inference_steps=2,
            guidance_scale=0,
            response_format="b64_json",
            model="m",
            negative_prompt="blur",
            user="u",
        ),
        "m",
        LIMITS,
    )
    assert (asked.width, asked.height, asked.n, asked.seed) == (64, 48, 3, 7)
    assert (asked.steps, asked.guidance_scale, asked.negative_prompt) == (2, 0.0, "blur")


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"prompt": ""}, "prompt", "invalid_value"),
        ({"prompt": "   "}, "prompt", "invalid_value"),
        ({"prompt": 3}, "prompt", "invalid_type"),
        ({"prompt": None}, "prompt", "missing_required_parameter"),
        ({"sizes": "64x64"}, "sizes", "unknown_parameter"),
        ({"size": "64"}, "size", "invalid_value"),
        ({"size": "60x64"}, "size", "invalid_value"),  # not a multiple of 8
        ({"size": "4096x64"}, "size", "invalid_value"),
        ({"size": "0x64"}, "size", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"n": 11}, "n", "invalid_value"),
        ({"n": 1.5}, "n", "invalid_type"),
        ({"n": True}, "n", "invalid_type"),
        ({"num_inference_steps": 0}, "num_inference_steps", "invalid_value"),
        ({"num_inference_steps": 501}, "num_inference_steps", "invalid_value"),
        ({"guidance_scale": -1}, "guidance_scale", "invalid_value"),
        ({"guidance_scale": 10**400}, "guidance_scale", "invalid_value"),  # was a 500 (fuzz)
        ({"guidance_scale": float("inf")}, "guidance_scale", "invalid_value"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"seed": 2**63}, "seed", "invalid_value"),
        ({"response_format": "url"}, "response_format", "unsupported_parameter"),
        ({"output_format": "jpeg"}, "output_format", "unsupported_parameter"),
        ({"model": "dall-e-4"}, "model", "model_not_found"),
        ({"model": "sora-2"}, "model", "model_not_found"),  # a video model's alias
        ({"model": 3}, "model", "invalid_type"),
    ],
)
def test_image_refusals_name_the_field(fields: dict[str, Any], param: str, code: str) -> None:
    body = json.dumps({"prompt": "a cat", **fields}).encode()
    exc = refused(parse_image_request, body, "m", LIMITS)
    assert (exc.param, exc.code) == (param, code)
    refusal = Refusal.of(exc)
    assert set(refusal.body()["error"]) == {"message", "type", "param", "code"}
    assert refusal.status == (404 if code == "model_not_found" else 400)


def test_a_model_not_served_is_told_which_one_is() -> None:
    """Issue 30: ``dall-e-2`` got a 404 that did not name the served model (it is an alias
    now); the refusal names the served model and the aliases, the client's value cut short."""
    body = json.dumps({"prompt": "a cat", "model": "dall-e-2" * 1000}).encode()
    exc = refused(parse_image_request, body, "tiny-image", LIMITS)
    assert "this server serves 'tiny-image'" in str(exc) and len(str(exc)) < 300
    assert "dall-e-2, dall-e-3, gpt-image-1, gpt-image-1-mini" in str(exc)
    video = {"prompt": "waves", "model": "dall-e-2"}
    exc = refused(parse_video_request, video, "tiny-video", LIMITS)
    assert "'tiny-video' (OpenAI's names sora-2, sora-2-pro" in str(exc)


@pytest.mark.parametrize("model", [None, "tiny-image", "dall-e-2", "dall-e-3", "gpt-image-1"])
def test_the_served_image_model_and_openais_names_are_accepted(model: str | None) -> None:
    assert parse_image_request(image(model=model), "tiny-image", LIMITS).prompt == "a cat"


@pytest.mark.parametrize("model", [None, "tiny-video", "sora-2", "sora-2-pro"])
def test_the_served_video_model_and_openais_names_are_accepted(model: str | None) -> None:
    form = {"prompt": "waves"} if model is None else {"prompt": "waves", "model": model}
    assert parse_video_request(form, "tiny-video", LIMITS).prompt == "waves"
    event = {"type": "session.start", "prompt": "p", "model": model}
    assert parse_realtime_video_start(event, "tiny-video", LIMITS).prompt == "p"


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'"x"', b"[" * 100_000])
def test_a_body_that_is_no_json_object_is_refused(body: bytes) -> None:
    assert refused(parse_image_request, body, "m", LIMITS).code == "invalid_json"


@given(st.dictionaries(st.text(max_size=20), st.none() | st.integers() | st.text(max_size=20)))
def test_any_json_object_is_parsed_or_refused_with_a_protocol_error(raw: dict[str, Any]) -> None:
    for parse in (parse_image_request, parse_video_request):
        try:
            parse(json.dumps(raw).encode(), "m", LIMITS)
        except ProtocolError as exc:
            assert exc.code and exc.message


def test_video_from_json_and_from_a_form() -> None:
    asked = parse_video_request(
        json.dumps({"prompt": "waves", "size": "32x16", "seconds": "2", "fps": 6}).encode(),
        "m",
        LIMITS,
    )
    assert (asked.width, asked.height, asked.seconds, asked.fps, asked.frames) == (
        32,
        16,
        "2",
        6,
        12,
    )
    form = {"prompt": "waves", "seconds": "1.5", "fps": "4", "seed": "9", "guidance_scale": "2"}
    asked = parse_video_request(form, "m", LIMITS)
    assert (asked.frames, asked.seed, asked.guidance_scale, asked.seconds) == (6, 9, 2.0, "1.5")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"seconds": "0"}, "seconds"),
        ({"seconds": "61"}, "seconds"),
        ({"seconds": "nan"}, "seconds"),
        ({"seconds": "four"}, "seconds"),
        ({"fps": "0"}, "fps"),
        ({"fps": "61"}, "fps"),
        ({"fps": "8.5"}, "fps"),
        ({"seconds": "0.01", "fps": "8"}, "seconds"),  # no whole frame
        ({"duration": "4"}, "duration"),
    ],
)
def test_video_refusals(fields: dict[str, str], param: str) -> None:
    assert refused(parse_video_request, {"prompt": "w", **fields}, "m", LIMITS).param == param


def test_realtime_start() -> None:
    start = parse_realtime_video_start(
        {"type": "session.start", "prompt": "p", "width": 32, "height": 16, "num_frames": 10},
        "m",
        LIMITS,
    )
    assert (start.width, start.height, start.frames) == (32, 16, 10)
    assert start.config()["format"] == "m4s"
    for bad, param in (
        ({"format": "mp4"}, "format"),
        ({"width": 30}, "width"),
        ({"num_frames": 0}, "num_frames"),
        ({"interaction": {}}, "interaction"),
    ):
        event = {"type": "session.start", "prompt": "p", **bad}
        assert refused(parse_realtime_video_start, event, "m", LIMITS).param == param
