"""The one ``model`` policy of the OpenAI-style routes (``duplex.services._models``), sans I/O:
the served names and each family's OpenAI aliases are accepted as sent; anything else is one
404 naming what is served."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.refusals import MAX_ECHO_CHARS, Refusal
from duplex.services._models import (
    AUDIO,
    CHAT,
    IMAGES,
    SPEECH,
    VIDEO_CHAT,
    VIDEOS,
    InvalidModel,
    ModelFamily,
    ModelNotFound,
    ModelRequired,
    served_names,
)

FAMILIES = {
    "speech": SPEECH,
    "images": IMAGES,
    "videos": VIDEOS,
    "audio": AUDIO,
    "chat": CHAT,
    "video chat": VIDEO_CHAT,
}


def test_openai_names_are_aliases_of_speech_images_and_videos_only() -> None:
    assert SPEECH.aliases == ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
    assert IMAGES.aliases == ("dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini")
    assert VIDEOS.aliases == ("sora-2", "sora-2-pro")
    assert AUDIO.aliases == CHAT.aliases == VIDEO_CHAT.aliases == ()


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())
def test_the_served_names_and_the_aliases_are_accepted_as_sent(family: ModelFamily) -> None:
    for name in ("espeak", *family.aliases):
        assert family.accepted(name, "espeak") == name
    assert family.accepted("/ckpt/tiny", served_names("/ckpt/tiny")) == "/ckpt/tiny"
    assert family.accepted("tiny", served_names("/ckpt/tiny/")) == "tiny"


def test_only_chat_requires_a_model() -> None:
    for family in (SPEECH, IMAGES, VIDEOS, AUDIO, VIDEO_CHAT):
        assert family.accepted(None, "m") is None
    with pytest.raises(ModelRequired) as caught:
        CHAT.accepted(None, "m")
    assert (caught.value.param, Refusal.of(caught.value).status) == ("model", 400)


@pytest.mark.parametrize("value", [5, True, ["tts-1"], {"name": "m"}])
def test_a_model_that_is_not_a_string_is_refused_as_its_type(value: object) -> None:
    with pytest.raises(InvalidModel) as caught:
        SPEECH.accepted(value, "m")
    assert (caught.value.code, caught.value.param) == ("invalid_type", "model")


def test_one_wording_names_the_served_model_and_the_aliases() -> None:
    with pytest.raises(ModelNotFound) as caught:
        SPEECH.accepted("x", "espeak")
    assert caught.value.message == (
        "The model 'x' is not served here; this server serves 'espeak' (OpenAI's names "
        "tts-1, tts-1-hd, gpt-4o-mini-tts are accepted as aliases)."
    )
    with pytest.raises(ModelNotFound) as caught:
        CHAT.accepted("gpt-4o", served_names("/models/tiny"))
    assert caught.value.message == (
        "The model 'gpt-4o' is not served here; this server serves 'tiny'."
    )
    refusal = Refusal.of(caught.value)
    assert (refusal.status, refusal.code, refusal.param) == (404, "model_not_found", "model")


def test_the_served_names_of_a_checkpoint() -> None:
    assert served_names("espeak") == ("espeak",)
    assert served_names("/models/tiny-vl") == ("tiny-vl", "/models/tiny-vl")
    assert served_names("/models/tiny-vl/") == ("tiny-vl", "/models/tiny-vl/")


@given(
    family=st.sampled_from(list(FAMILIES.values())),
    served=st.text(min_size=1, max_size=20),
    asked=st.text(max_size=400),
)
def test_any_other_string_is_refused_naming_the_served_model(
    family: ModelFamily, served: str, asked: str
) -> None:
    if asked == served or asked in family.aliases:
        assert family.accepted(asked, served) == asked
        return
    with pytest.raises(ModelNotFound) as caught:
        family.accepted(asked, served)
    message = caught.value.message
    assert f"this server serves {served!r}" in message
    assert all(alias in message for alias in family.aliases)
    assert caught.value.param == "model"
    assert len(message) < 2 * MAX_ECHO_CHARS + len(repr(served)) + 200  # the echo is bounded
