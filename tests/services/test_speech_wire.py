"""The speech endpoints' protocol without sockets: request validation and the stream machine."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.services.speech._protocol import (
    MAX_BATCH_ITEMS,
    MAX_INPUT_CHARS,
    MAX_STREAM_TEXT_BYTES,
    CloseStream,
    FinishUtterance,
    Refusal,
    Reply,
    Speak,
    SpeechParams,
    SpeechStream,
    StreamConfig,
    parse_batch,
    parse_speech,
)

VOICES = {"alloy", "coral", "en-us"}
SERVED = "espeak"
"""The TTS's name (``GET /v1/models``), as the route hands it to the parsers."""


def check_voice(voice: str) -> str | None:
    return None if voice in VOICES else f"unknown voice {voice!r}: use one of alloy, coral"


def speech(**fields: Any) -> SpeechParams | Refusal:
    return parse_speech(json.dumps({"input": "Hello.", **fields}), SERVED, check_voice)


def test_defaults_and_every_field() -> None:
    assert speech() == SpeechParams("Hello.")
    full = speech(
        model="tts-1", voice="coral", response_format="flac", speed=2, sample_rate=16000,
        stream=False, stream_format="audio", instructions="",
    )  # fmt: skip
    assert full == SpeechParams("Hello.", "coral", "flac", 2.0, 16000, False, "tts-1")
    assert speech(response_format="pcm", stream=True) == SpeechParams(
        "Hello.", response_format="pcm", stream=True
    )


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"foo": 1}, "foo", "unknown_parameter"),
        ({"input": ""}, "input", "empty_input"),
        ({"input": "  \n"}, "input", "empty_input"),
        ({"input": 3}, "input", "invalid_type"),
        ({"input": "x" * (MAX_INPUT_CHARS + 1)}, "input", "string_above_max_length"),
        ({"voice": "nova"}, "voice", "invalid_value"),
        ({"voice": 1}, "voice", "invalid_type"),
        ({"response_format": "ogg"}, "response_format", "invalid_value"),
        ({"speed": 0.2}, "speed", "invalid_value"),
        ({"speed": 4.5}, "speed", "invalid_value"),
        ({"speed": "fast"}, "speed", "invalid_type"),
        ({"speed": True}, "speed", "invalid_type"),
        ({"speed": 10**400}, "speed", "invalid_value"),  # was a 500 (float overflow; fuzz)
        ({"sample_rate": 12345}, "sample_rate", "invalid_value"),
        ({"sample_rate": 16000.0}, "sample_rate", "invalid_value"),
        ({"response_format": "opus", "sample_rate": 16000}, "sample_rate", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stream": True, "response_format": "flac"}, "response_format", "invalid_value"),
        ({"stream_format": "sse"}, "stream_format", "invalid_value"),
        ({"instructions": "whisper"}, "instructions", "unsupported_parameter"),
        ({"model": 5}, "model", "invalid_type"),
    ],
)
def test_each_bad_field_is_refused_by_name(fields: dict[str, Any], param: str, code: str) -> None:
    refused = speech(**fields)
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.param, refused.code) == (400, param, code)
    body = refused.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error" and body["message"]


@pytest.mark.parametrize("model", [None, SERVED, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"])
def test_the_served_model_and_openais_names_are_accepted_and_echoed(model: str | None) -> None:
    asked = speech(model=model)
    assert isinstance(asked, SpeechParams) and asked.model == model
    (item,) = parse_batch(json.dumps({"input": ["One."], "model": model}), SERVED, check_voice)
    assert item.model == model


@pytest.mark.parametrize("model", ["tts-2", "dall-e-3", "", "ESPEAK", "x" * 10_000])
def test_any_other_model_is_a_404_naming_the_served_one(model: str) -> None:
    for refused in (
        speech(model=model),
        parse_batch(json.dumps({"input": ["One."], "model": model}), SERVED, check_voice),
    ):
        assert isinstance(refused, Refusal)
        assert (refused.status, refused.code, refused.param) == (404, "model_not_found", "model")
        assert "this server serves 'espeak'" in refused.message
        assert "tts-1, tts-1-hd, gpt-4o-mini-tts" in refused.message
        assert len(refused.message) < 400
    stream = SpeechStream(SERVED, check_voice)
    (error,) = errors(send(stream, type="session.config", model=model))
    assert error["code"] == "model_not_found" and "'espeak'" in error["message"]
    assert send(stream, type="session.config", model="tts-1") == []  # still usable


def test_limits_accept_their_edges() -> None:
    assert isinstance(speech(input="x" * MAX_INPUT_CHARS), SpeechParams)
    assert isinstance(speech(speed=0.25), SpeechParams)
    assert isinstance(speech(speed=4.0), SpeechParams)
    assert isinstance(speech(response_format="opus", sample_rate=24000), SpeechParams)


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'"x"', b"\xff", b'{"input": NaN}'])
def test_a_body_that_is_not_a_json_object(body: bytes) -> None:
    refused = parse_speech(body, SERVED, check_voice)
    assert isinstance(refused, Refusal) and refused.code == "invalid_json"


def test_missing_input() -> None:
    refused = parse_speech(b"{}", SERVED, check_voice)
    assert isinstance(refused, Refusal) and refused.code == "missing_required_parameter"


def test_batch() -> None:
    items = parse_batch(
        json.dumps({"input": ["One.", "Two."], "voice": "coral"}), SERVED, check_voice
    )
    assert items == [SpeechParams("One.", "coral"), SpeechParams("Two.", "coral")]
    for body, param in [
        ({"input": []}, "input"),
        ({"input": ["x"] * (MAX_BATCH_ITEMS + 1)}, "input"),
        ({"input": "One."}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": ["ok"], "stream": True}, "stream"),
        ({"input": ["ok"], "voice": "nova"}, "voice"),
    ]:
        refused = parse_batch(json.dumps(body), SERVED, check_voice)
        assert isinstance(refused, Refusal) and refused.param == param, body
    assert (
        len(parse_batch(json.dumps({"input": ["x"] * MAX_BATCH_ITEMS}), SERVED, check_voice)) == 64
    )


# -- the stream ------------------------------------------------------------------------------


def send(stream: SpeechStream, **event: Any) -> list[Any]:
    return stream.receive(json.dumps(event))


def errors(actions: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(a.text) for a in actions if isinstance(a, Reply)]


def test_a_stream_speaks_sentence_by_sentence() -> None:
    stream = SpeechStream(SERVED, check_voice)
    assert send(stream, type="session.config", voice="coral", response_format="pcm") == []
    config = StreamConfig(voice="coral", response_format="pcm")
    assert send(stream, type="input.text", text="Hello there. How") == [
        Speak(0, 0, "Hello there.", config)
    ]
    assert send(stream, type="input.text", text=" are you? Fine") == [
        Speak(0, 1, "How are you?", config)
    ]
    assert send(stream, type="input.done") == [
        Speak(0, 2, "Fine", config),
        FinishUtterance(0, 3),
    ]
    assert send(stream, type="input.done") == [FinishUtterance(1, 0)]  # an empty utterance
    assert send(stream, type="session.config", split_granularity="none") == []
    assert send(stream, type="input.text", text="One. Two.") == []
    (speak, done) = send(stream, type="input.done")
    assert (speak.text, speak.utterance_index, done) == ("One. Two.", 2, FinishUtterance(2, 1))
    assert send(stream, type="session.close") == [CloseStream(1000, "session_closed")]
    assert send(stream, type="input.text", text="ignored") == []


def test_stream_errors_keep_it_usable() -> None:
    stream = SpeechStream(SERVED, check_voice)
    cases = [
        ("not json", "invalid_json"),
        (json.dumps({"type": "input.text", "text": "x"}), "config_required"),
        (json.dumps({"type": "nope"}), "unknown_event"),
        (json.dumps({"type": "session.config", "voice": "nova"}), "invalid_value"),
        (json.dumps({"type": "session.config", "task_type": "Base"}), "unknown_parameter"),
        (json.dumps({"type": "session.config", "split_granularity": "clause"}), "invalid_value"),
    ]
    for frame, code in cases:
        (error,) = errors(stream.receive(frame))
        assert (error["type"], error["code"]) == ("error", code), frame
    (error,) = errors(stream.receive(b"\x00"))
    assert error["code"] == "bad_frame"
    assert send(stream, type="session.config") == []
    assert send(stream, type="input.text", text="Half") == []
    (error,) = errors(send(stream, type="session.config", voice="alloy"))
    assert error["code"] == "bad_state"  # mid-utterance
    (error,) = errors(send(stream, type="input.text", text=5))
    assert error["code"] == "invalid_type"
    big = "x" * (MAX_STREAM_TEXT_BYTES + 1)
    (error,) = errors(send(stream, type="input.text", text=big))
    assert error["code"] == "text_too_large"
    assert send(stream, type="input.done") == [
        Speak(0, 0, "Half", StreamConfig()),
        FinishUtterance(0, 1),
    ]


events = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("session.config")},
        optional={
            "voice": st.sampled_from(["alloy", "nova"]),
            "split_granularity": st.sampled_from(["sentence", "none", "x"]),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("input.text"), "text": st.text(alphabet="ab .!?", max_size=30)}
    ),
    st.just({"type": "input.done"}),
    st.just({"type": "bogus"}),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=25))
def test_any_event_sequence_gives_consistent_utterances(sequence: list[dict[str, Any]]) -> None:
    stream = SpeechStream(SERVED, check_voice)
    spoken: dict[int, list[int]] = {}
    finished: dict[int, int] = {}
    for event in sequence:
        for action in stream.receive(json.dumps(event)):
            if isinstance(action, Speak):
                assert action.text.strip() and action.utterance_index not in finished
                spoken.setdefault(action.utterance_index, []).append(action.sentence_index)
            elif isinstance(action, FinishUtterance):
                finished[action.utterance_index] = action.total_sentences
            else:
                assert isinstance(action, Reply)
                assert json.loads(action.text)["type"] == "error"
    for utterance, indices in spoken.items():
        assert indices == list(range(len(indices)))
        if utterance in finished:
            assert finished[utterance] == len(indices)
    assert sorted(finished) == list(range(len(finished)))
