"""The chat completion wire, sans I/O: every field checked, refusals name their field,
hostile input bounded, and the answers' shapes (``duplex.services.chat``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.models.agent import ReplyDelta
from duplex.refusals import Refusal
from duplex.services.chat import ChatBatch, ChatCompletion, ModelInfo, parse_batch, parse_chat
from duplex.services.chat._protocol import (
    EXTENSION_PARAMETERS,
    MAX_CONTENT_PARTS,
    MAX_IMAGE_BYTES,
    Choice,
    chunk,
    completion_body,
    usage_chunk,
)

TEXT = ModelInfo(("tiny", "/models/tiny"))
VISION = ModelInfo(("tiny-vl",), multimodal=True, max_images=2)
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
HI = [{"role": "user", "content": "hi"}]


def _body(**fields: Any) -> bytes:
    return json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


def _refused(body: bytes, model: ModelInfo = TEXT) -> Refusal:
    parsed = parse_chat(body, model)
    assert isinstance(parsed, Refusal), parsed
    return parsed


def _image_part(data: bytes = PNG, media: str = "image/png") -> dict[str, Any]:
    url = f"data:{media};base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_plain_request_and_its_defaults() -> None:
    parsed = parse_chat(_body(), TEXT)
    assert isinstance(parsed, ChatCompletion)
    assert parsed.model == "tiny" and parsed.n == 1 and not parsed.stream
    (turn,) = parsed.request.turns
    assert (turn.role, turn.text) == ("user", "hi")
    assert parsed.request.sampling.max_tokens is None and parsed.request.tool_choice == "none"


def test_every_openai_sampling_field_reaches_the_request() -> None:
    parsed = parse_chat(
        _body(
            max_completion_tokens=7,
            temperature=0.5,
            top_p=0.9,
            stop=["x", "y"],
            seed=3,
            n=2,
            presence_penalty=0.1,
            frequency_penalty=-0.1,
            stream=True,
            stream_options={"include_usage": True},
            top_k=5,
            min_p=0.1,
            repetition_penalty=1.1,
            min_tokens=2,
            ignore_eos=True,
            stop_token_ids=[1, 2],
        ),
        TEXT,
    )
    assert isinstance(parsed, ChatCompletion)
    s = parsed.request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.stop, s.seed) == (7, 0.5, 0.9, ("x", "y"), 3)
    assert (s.top_k, s.min_p, s.repetition_penalty, s.min_tokens, s.ignore_eos) == (
        5,
        0.1,
        1.1,
        2,
        True,
    )
    assert s.stop_token_ids == (1, 2) and parsed.n == 2 and parsed.include_usage


@pytest.mark.parametrize("name", EXTENSION_PARAMETERS)
def test_an_extension_parameter_in_extra_body_is_taken_and_twice_is_refused(name: str) -> None:
    value: Any = {
        "top_k": 4,
        "min_p": 0.2,
        "repetition_penalty": 1.2,
        "min_tokens": 1,
        "ignore_eos": True,
        "stop_token_ids": [3],
    }[name]
    parsed = parse_chat(_body(extra_body={name: value}), TEXT)
    assert isinstance(parsed, ChatCompletion)
    refused = _refused(_body(extra_body={name: value}, **{name: value}))
    assert (refused.status, refused.code, refused.param) == (400, "duplicate_parameter", name)
    assert name in refused.message


def test_a_repeated_json_key_is_refused_by_name() -> None:
    body = b'{"model": "tiny", "temperature": 1, "messages": [], "temperature": 0.5}'
    refused = _refused(body)
    assert (refused.code, refused.param) == ("duplicate_parameter", "temperature")


def test_max_tokens_and_max_completion_tokens_together_are_refused() -> None:
    refused = _refused(_body(max_tokens=3, max_completion_tokens=3))
    assert refused.code == "duplicate_parameter"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"top_k": -2}, "top_k"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_token": 5}, "max_token"),
        ({"logprobs": True}, "logprobs"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"tool_choice": "required", "tools": []}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"extra_body": {"temperature": 0.1}}, "extra_body.temperature"),
        ({"model": "gpt-4o"}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_a_bad_field_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    refused = _refused(_body(**fields))
    assert refused.param == param, refused
    assert refused.status in (400, 404)


def test_the_model_is_the_checkpoint_asked_for_by_either_name_and_no_alias() -> None:
    """Chat takes no OpenAI alias (docs/operations.md, "The `model` of a request"): an app
    that chooses a chat model gets that checkpoint, or a 404 naming the one served."""
    for name in TEXT.names:
        parsed = parse_chat(_body(model=name), TEXT)
        assert isinstance(parsed, ChatCompletion) and parsed.model == name  # echoed as sent
    for name in ("gpt-4o", "gpt-4o-mini", "tts-1", "dall-e-2", "", "TINY"):
        for refused in (
            _refused(_body(model=name)),
            parse_batch(json.dumps({"model": name, "messages": [HI]}).encode(), TEXT),
        ):
            assert isinstance(refused, Refusal)
            assert (refused.status, refused.code, refused.param) == (
                404,
                "model_not_found",
                "model",
            )
            assert refused.message == (
                f"The model {name!r} is not served here; this server serves 'tiny'."
            )
    missing = _refused(json.dumps({"messages": HI}).encode())
    assert (missing.status, missing.code, missing.param) == (
        400,
        "missing_required_parameter",
        "model",
    )


def test_images_are_refused_on_a_text_model_naming_the_part() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "what"}, _image_part()]}]
    refused = _refused(_body(messages=messages))
    assert refused.status == 400 and refused.code == "image_input_not_supported"
    assert refused.param == "messages[0].content[1].image_url"
    parsed = parse_chat(_body(model="tiny-vl", messages=messages), VISION)
    assert isinstance(parsed, ChatCompletion)
    assert parsed.request.images == 1 and parsed.request.turns[0].parts[1].image == PNG


@pytest.mark.parametrize(
    ("part", "code"),
    [
        (
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            "invalid_image_url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}},
            "invalid_image_url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}},
            "invalid_image_url",
        ),
        (_image_part(b"GIF89a-but-said-png"), "invalid_image"),
        (_image_part(b"\0" * (MAX_IMAGE_BYTES + 3)), "image_too_large"),
        ({"type": "input_audio", "input_audio": {}}, "unsupported_parameter"),
    ],
)
def test_hostile_images_are_refused_before_they_are_decoded(
    part: dict[str, Any], code: str
) -> None:
    messages = [{"role": "user", "content": [part]}]
    refused = _refused(_body(model="tiny-vl", messages=messages), VISION)
    assert refused.code == code and refused.param is not None
    assert len(refused.message) < 400  # the client's value is never echoed whole


def test_ten_thousand_content_parts_are_refused() -> None:
    parts = [{"type": "text", "text": "a"}] * 10_000
    refused = _refused(_body(messages=[{"role": "user", "content": parts}]))
    assert refused.param == f"messages[0].content[{MAX_CONTENT_PARTS}]"
    ok = [{"type": "text", "text": "a"}] * MAX_CONTENT_PARTS
    assert isinstance(
        parse_chat(_body(messages=[{"role": "user", "content": ok}]), TEXT), ChatCompletion
    )


def test_too_many_images_are_refused() -> None:
    messages = [{"role": "user", "content": [_image_part()] * 3}]
    refused = _refused(_body(model="tiny-vl", messages=messages), VISION)
    assert refused.param == "messages[0].content[2].image_url"


def test_tools_tool_calls_and_a_named_choice() -> None:
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    parsed = parse_chat(_body(messages=messages, tools=[tool], tool_choice=choice), TEXT)
    assert isinstance(parsed, ChatCompletion)
    assert parsed.request.tool_choice == "get_weather"
    assert parsed.request.turns[1].tool_calls[0].name == "get_weather"
    assert parsed.request.turns[2].tool_call_id == "c1"
    bad = {"type": "function", "function": {"name": "nope"}}
    assert _refused(_body(tools=[tool], tool_choice=bad)).param == "tool_choice"


def test_response_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    parsed = parse_chat(_body(response_format=fmt), TEXT)
    assert isinstance(parsed, ChatCompletion)
    assert parsed.request.response_format is not None
    assert json.loads(parsed.request.response_format.schema_json) == schema
    parsed = parse_chat(_body(response_format={"type": "text"}), TEXT)
    assert isinstance(parsed, ChatCompletion) and parsed.request.response_format is None


def test_the_batch_takes_conversations_and_refuses_what_it_cannot_do() -> None:
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
            "max_tokens": 4,
        }
    ).encode()
    parsed = parse_batch(body, TEXT)
    assert isinstance(parsed, ChatBatch)
    assert [r.turns[0].text for r in parsed.requests] == ["a", "b"]
    for extra, param in [
        ({"stream": True}, "stream"),
        ({"n": 2}, "n"),
        ({"tools": []}, "tools"),
        ({"use_beam_search": True}, "use_beam_search"),
    ]:
        refused = parse_batch(json.dumps({**json.loads(body), **extra}).encode(), TEXT)
        assert isinstance(refused, Refusal) and refused.param == param, refused
        assert "batch" in refused.message


def test_a_choice_gathers_text_and_calls_into_its_chunks_and_message() -> None:
    choice = Choice(0)
    assert choice.add(ReplyDelta("Hel")) == {"content": "Hel"}
    assert choice.add(ReplyDelta("lo")) == {"content": "lo"}
    opened = choice.add(ReplyDelta("", "call_1", "f", call_done=False))
    assert opened == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": ""},
            }
        ]
    }
    assert choice.add(ReplyDelta('{"a"', "call_1", "f", call_done=False)) == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]
    }
    choice.add(ReplyDelta(": 1}", "call_1", "f"))
    choice.add(ReplyDelta(finish="tool_calls"))
    body = choice.body()
    assert body["finish_reason"] == "tool_calls"
    assert body["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    whole = completion_body("id", 1, "tiny", [choice], 5, 7)
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    assert chunk("id", 1, "tiny", 0, {"content": "x"}, include_usage=True)["usage"] is None
    assert usage_chunk("id", 1, "tiny", 2, 3)["choices"] == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(
            [
                "model",
                "messages",
                "stream",
                "stream_options",
                "max_tokens",
                "temperature",
                "top_p",
                "stop",
                "seed",
                "n",
                "tools",
                "tool_choice",
                "response_format",
                "top_k",
                "extra_body",
                "min_p",
            ]
        ),
        _json,
        max_size=8,
    )
)
def test_any_json_body_parses_or_is_refused_never_raises(fields: dict[str, Any]) -> None:
    for parse in (parse_chat, parse_batch):
        out = parse(json.dumps(fields).encode(), VISION)
        assert isinstance(out, (ChatCompletion, ChatBatch, Refusal))
        if isinstance(out, Refusal):
            assert out.status in (400, 404, 413) and len(out.message) < 2000


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    assert isinstance(parse_chat(data, TEXT), (ChatCompletion, Refusal))


def test_a_body_past_the_limit_is_413_and_one_at_it_is_read() -> None:
    from duplex.services.chat._protocol import MAX_CHAT_BODY

    head = _body()[:-1] + b', "user": "'
    fits = head + b"u" * (MAX_CHAT_BODY - len(head) - 2) + b'"}'
    assert len(fits) == MAX_CHAT_BODY
    assert isinstance(parse_chat(fits, TEXT), ChatCompletion)
    refused = _refused(fits[:-2] + b'u"}')
    assert (refused.status, refused.code) == (413, "body_too_large")
