"""The generation surface of a session: text-only and out-of-band responses, token limits,
tool items a response continues from, and one error naming every bad field."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.exceptions import InvalidParameters, ProtocolError
from duplex.sessions import (
    AudioAppend,
    AudioCommit,
    AudioDelta,
    ErrorEvent,
    ItemCreate,
    ResponseCreate,
    ResponseDone,
    ResponseOptions,
    SessionOptions,
    SessionUpdate,
    TextDelta,
    Tick,
)

from .sessionkit import machine, of

TURN_BASED = {"turn_policy": "turn_based", "turn_detection": "none"}


def _respond(m, options=None, now=1.0):
    return m.handle(ResponseCreate(None, options), now)


def test_a_text_only_response_sends_text_and_keeps_a_text_item():
    m = machine(**TURN_BASED, output_modalities="text")
    m.handle(ItemCreate("user", "hello", item_id="u1"), 0.0)
    out = _respond(m)
    assert not of(out, AudioDelta)
    assert [d.delta for d in of(out, TextDelta)] == ["hello"]
    (done,) = of(out, ResponseDone)
    assert done.settings.text_only and done.transcript == "hello"
    assert (m.history[-1].role, m.history[-1].content, m.history[-1].text) == (
        "assistant", "text", "hello",
    )  # fmt: skip


def test_an_out_of_band_response_joins_no_conversation():
    m = machine(**TURN_BASED)
    m.handle(ItemCreate("user", "hello", item_id="u1"), 0.0)
    out = _respond(m, ResponseOptions(conversation="none", output_modalities="text"))
    assert of(out, ResponseDone)[0].status == "completed"
    assert [i.item_id for i in m.history] == ["u1"]


def test_a_tool_result_is_what_the_next_response_continues_from():
    m = machine(**TURN_BASED, output_modalities="text")
    m.handle(ItemCreate("user", "weather?", item_id="u1"), 0.0)
    call = ItemCreate("assistant", '{"city":"Paris"}', kind="function_call", call_id="c1", name="w")
    m.handle(call, 0.1)
    m.handle(ItemCreate("tool", "21 C", kind="function_call_output", call_id="c1"), 0.2)
    assert of(_respond(m), ResponseDone)[0].transcript == "21 C"
    kinds = [(i.content, i.call_id) for i in m.history]
    assert kinds[:3] == [("text", ""), ("function_call", "c1"), ("function_call_output", "c1")]


def test_max_output_tokens_ends_a_response_incomplete_and_recovers():
    m = machine(**TURN_BASED)
    m.handle(AudioAppend(np.full(24000, 0.1, np.float32)), 0.0)  # 1 s: 13 frames with marks
    m.handle(AudioCommit(), 0.0)
    out = _respond(m, ResponseOptions(max_output_tokens=2))
    for t in range(1, 20):
        out += m.handle(Tick(), 1.0 + t * 0.08)
    (done,) = of(out, ResponseDone)
    assert (done.status, done.reason) == ("incomplete", "max_output_tokens")
    assert done.transcript == "[0][80]" and len(of(out, AudioDelta)) == 2
    again = _respond(m, now=5.0)  # the next response is not limited
    for t in range(1, 20):
        again += m.handle(Tick(), 5.0 + t * 0.08)
    (done,) = of(again, ResponseDone)
    assert done.status == "completed" and len(of(again, AudioDelta)) == 13


BAD = {
    "voice": "robot",
    "temperature": 9.0,
    "max_output_tokens": 0,
    "tool_choice": "required",
    "output_modalities": "video",
    "overlap_policy": "sometimes",
}


@given(st.sets(st.sampled_from(sorted(BAD)), min_size=1))
def test_one_error_names_every_bad_field(keys):
    with pytest.raises(ProtocolError) as info:
        SessionOptions(**{k: BAD[k] for k in keys})
    named = {p.strip() for p in str(info.value.param).split(",")}
    assert named == {f"session.{k}" for k in keys}
    assert isinstance(info.value, InvalidParameters) == (len(keys) > 1)


def test_a_refused_update_leaves_the_session_usable():
    m = machine(**TURN_BASED)
    out = m.handle(SessionUpdate(SessionOptions(voice="marin", instructions="be brief")), 0.0)
    assert m.config.voice == "marin" and m.config.instructions == "be brief"
    with pytest.raises(ProtocolError):
        SessionOptions(voice="robot", temperature=5)
    assert not of(out, ErrorEvent)
