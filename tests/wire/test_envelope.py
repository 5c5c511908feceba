"""The one envelope parser: every frame check, and fuzz of it and of both projections.

`read_envelope` is the only code that reads a frame up to ``type`` and ``event_id``;
the native and Realtime projections call it. The properties, on any text or bytes
(lone surrogates, nesting at and past the parser's limit, 5000-digit integers,
``NaN``/``Infinity``, non-objects, ``type``/``event_id`` of every JSON type):

- `read_envelope` returns an `Envelope` or raises one of its four codes, nothing else;
- each projection's ``parse`` returns a client event or raises a `ProtocolError`;
- where the envelope fails, every projection fails with the same error (class,
  message, ``event_id``, ``param``): one parser, not copies;
- where the envelope holds, every projection error names the envelope's ``event_id``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.exceptions import (
    ERROR_CLASSES,
    BadEvent,
    BinaryFrameUnsupported,
    EventTooLarge,
    InvalidJson,
    ProtocolError,
)
from duplex.sessions import CLIENT_EVENT_TYPES
from duplex.wire._envelope import Envelope, frame_size, read_envelope
from duplex.wire._native import CLIENT_EVENT_NAMES, NativeProjection
from duplex.wire._realtime import (
    DUPLEX_CLIENT_EVENTS,
    REALTIME_CLIENT_EVENTS,
    UNSUPPORTED_CLIENT_EVENTS,
    RealtimeProjection,
)

ENVELOPE_ERRORS = (EventTooLarge, BinaryFrameUnsupported, InvalidJson, BadEvent)


def _error(data: str | bytes, **kw) -> tuple[type, str, str | None, str | None]:
    with pytest.raises(ProtocolError) as info:
        read_envelope(data, **kw)
    exc = info.value
    return type(exc), exc.message, exc.event_id, exc.param


# ---------------------------------------------------------------- every check


def test_a_valid_frame_is_its_envelope():
    env = read_envelope('{"type": "x.y", "event_id": "e1", "n": NaN}')
    assert (env.type, env.event_id, set(env.body)) == ("x.y", "e1", {"type", "event_id", "n"})
    assert read_envelope('{"type": "x", "event_id": null}').event_id is None
    assert read_envelope('{"type": "x", "type": "z"}').type == "z"  # the last key wins
    assert read_envelope('{"type": "\\ud800"}').type == "\ud800"  # kept, as before


@pytest.mark.parametrize(
    ("data", "kw", "expected"),
    [
        (b"{}", {}, (BinaryFrameUnsupported, "binary frames are not accepted; send JSON text")),
        (b"x" * 11, {"max_size": 10}, (EventTooLarge, "message is over 10 bytes")),
        ("x" * 11, {"max_size": 10}, (EventTooLarge, "message is over 10 bytes")),
        ("é" * 6, {"max_size": 10}, (EventTooLarge, "message is over 10 bytes")),  # 12 bytes
        ("\ud800" * 4, {"max_size": 10}, (EventTooLarge, "message is over 10 bytes")),  # 12
        ("[1]", {}, (BadEvent, "an event must be a JSON object")),
        ("NaN", {}, (BadEvent, "an event must be a JSON object")),
        ('"\\ud800"', {}, (BadEvent, "an event must be a JSON object")),
        ('{"type": "x", "event_id": 5}', {}, (BadEvent, "event_id must be a string")),
    ],
)
def test_frame_errors(data, kw, expected):
    cls, message, event_id, param = _error(data, **kw)
    assert (cls, message) == expected
    assert event_id is None
    assert param == ("event_id" if "event_id" in message else None)


def test_json_errors_are_invalid_json():
    for text in ("{", "", "1" * 5000, "[" * 5000, '{"type": "x"} {}', "{'type': 'x'}"):
        cls, message, event_id, param = _error(text)
        assert cls is InvalidJson and message.startswith("invalid JSON: ")
        assert (event_id, param) == (None, None)


def test_type_errors_name_the_event_id():
    # Drifted before: Realtime said "type must be a string" also when it was missing.
    for text in ('{"event_id": "e1"}', '{"event_id": "e1", "type": null}'):
        assert _error(text) == (BadEvent, "missing required field 'type'", "e1", "type")
    for value in ("3", "true", "[]", "{}", "NaN"):
        text = f'{{"event_id": "e1", "type": {value}}}'
        assert _error(text) == (BadEvent, "type must be a string", "e1", "type")
    # event_id is checked first: a frame with both wrong says event_id.
    assert _error('{"event_id": 1}')[1:] == ("event_id must be a string", None, "event_id")


def test_size_is_utf8_bytes_exactly_at_the_limit():
    for text in ('{"type":"é"}', '{"type":"\U0001f600"}', '{"type":"\ud800"}'):
        size = len(text.encode("utf-8", "surrogatepass"))
        assert frame_size(text) == size
        assert read_envelope(text, max_size=size).type == json.loads(text)["type"]
        assert _error(text, max_size=size - 1)[0] is EventTooLarge
    assert _error(b"x", max_size=1)[0] is BinaryFrameUnsupported  # binary: its length
    assert _error(b"xy", max_size=1)[0] is EventTooLarge


@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.text())
def test_frame_size_is_the_utf8_size(text):
    assert frame_size(text) == len(text.encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------------ fuzz


@dataclass(frozen=True)
class Raw:
    """JSON text written as is: what ``json.dumps`` cannot or will not write."""

    text: str


def _nest(depth: int) -> Raw:
    return Raw("[" * depth + "]" * depth)


HOSTILE = st.sampled_from([
    Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999"), Raw("-1e400"),
    Raw("1" * 5000), Raw("-" + "9" * 4300), Raw(str(2**64)), Raw("0.1e-400"),
    Raw('"\\ud800"'), Raw('"a\\udfffb"'), Raw('"\ud800"'), Raw('"\\u0000"'),
    _nest(5), _nest(400), _nest(5000), Raw('{"a":' * 3000 + "1" + "}" * 3000),
    Raw("true"), Raw("null"), Raw("[]"), Raw("{}"), Raw('"AAAA"'), Raw('"AQA="'),
])  # fmt: skip
"""Literals a client could send (Python's parser takes NaN, Infinity and lone surrogates)."""

LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | HOSTILE
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
NAMES = sorted(
    set(CLIENT_EVENT_NAMES)
    | set(REALTIME_CLIENT_EVENTS)
    | set(DUPLEX_CLIENT_EVENTS)
    | set(UNSUPPORTED_CLIENT_EVENTS)
)
FIELDS = st.sampled_from([
    "session", "audio", "format", "sample_rate", "response", "response_id", "played_ms",
    "item", "item_id", "previous_item_id", "content_index", "audio_end_ms", "event",
    "payload", "session_id", "resume_token", "server_event_seq", "frame", "frame_id",
    "pts_ms", "x",
])  # fmt: skip


def _render(value: object, ascii_only: bool) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        items = (
            f"{json.dumps(k, ensure_ascii=ascii_only)}:{_render(v, ascii_only)}"
            for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_render(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def frames(draw: st.DrawFn) -> str | bytes:
    """A frame near the envelope's checks: mostly objects, often with a known ``type``."""
    shape = draw(st.sampled_from(["object", "object", "object", "value", "text", "bytes"]))
    if shape == "text":
        return draw(st.text(max_size=100))
    if shape == "bytes":
        return draw(st.binary(max_size=100))
    if shape == "value":
        return _render(draw(VALUES), draw(st.booleans()))
    obj: dict[str, object] = {}
    odds = draw(st.integers(0, 19))  # mostly a known type and a string event_id
    if odds:
        obj["type"] = draw(st.sampled_from(NAMES) if odds > 3 else st.text(max_size=8) | LEAVES)
    odds = draw(st.integers(0, 19))
    if odds:
        obj["event_id"] = draw(st.text(max_size=8) if odds > 3 else LEAVES)
    obj |= draw(st.dictionaries(FIELDS, VALUES, max_size=4))
    text = _render(obj, draw(st.booleans()))
    cut = draw(st.sampled_from(["whole"] * 8 + ["cut", "junk"]))
    if cut == "cut":
        return text[: draw(st.integers(0, len(text)))]
    return text + "x" if cut == "junk" else text


PROJECTIONS: dict[str, Callable[[int], object]] = {
    "native": lambda size: NativeProjection(max_size=size),
    "realtime": lambda size: RealtimeProjection(max_size=size),
    "realtime+duplex": lambda size: RealtimeProjection(duplex=True, max_size=size),
    "beta+duplex": lambda size: RealtimeProjection(schema="beta", duplex=True, max_size=size),
}


def _outcome(parse: Callable[[str | bytes], object], data: str | bytes) -> object:
    """What ``parse`` returns, or the `ProtocolError` it raises; anything else fails."""
    try:
        return parse(data)
    except ProtocolError as exc:
        assert isinstance(exc, ERROR_CLASSES[exc.code]), exc
        assert isinstance(exc.message, str) and exc.message
        json.dumps({"message": exc.message, "param": exc.param})  # the error event encodes
        return exc


def _too_deep(outcome: object) -> bool:
    return isinstance(outcome, InvalidJson) and isinstance(outcome.__cause__, RecursionError)


def _check(data: str | bytes, max_size: int) -> None:
    envelope = _outcome(lambda d: read_envelope(d, max_size=max_size), data)
    if isinstance(envelope, ProtocolError):
        assert isinstance(envelope, ENVELOPE_ERRORS)
    else:
        assert isinstance(envelope, Envelope)
        assert isinstance(envelope.type, str) and envelope.body["type"] == envelope.type
        assert envelope.event_id is None or isinstance(envelope.event_id, str)
        assert envelope.body.get("event_id") == envelope.event_id
    for make in PROJECTIONS.values():
        got = _outcome(make(max_size).parse, data)
        if _too_deep(envelope) or _too_deep(got):
            continue  # the nesting limit counts the caller's frames: it moves by a frame or two
        if isinstance(envelope, ProtocolError):  # the same error, from the same code
            assert isinstance(got, ProtocolError)
            seen = (type(got), got.message, got.event_id, got.param)
            assert seen == (type(envelope), envelope.message, envelope.event_id, envelope.param)
        elif isinstance(got, ProtocolError):
            assert got.event_id == envelope.event_id
        else:
            assert isinstance(got, CLIENT_EVENT_TYPES)


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=frames(), max_size=st.sampled_from([1 << 24] * 6 + [20_000, 64]))
def test_fuzz_any_frame_gives_an_envelope_or_a_protocol_error(data, max_size):
    _check(data, max_size)


@pytest.mark.parametrize(
    "template",
    [
        '{{"type": {}}}',
        '{{"type": "session.update", "event_id": {}}}',
        '{{"type": "session.update", "session": {}}}',
        '{{"type": "session.create", "session": {{"prompt": {}}}}}',
        '{{"type": "input_audio_buffer.append", "audio": {}}}',
        '{{"type": "conversation.item.create", "item": {{"type": {}}}}}',
        '{{"type": "conversation.item.create", "item": {{"role": "user", "content": [{}]}}}}',
        '{{"type": "response.create", "response": {{"modalities": {}}}}}',
        '{{"type": "turn.signal", "event": "barge_in", "payload": {{"source": {}}}}}',
        '{{"type": "input_video.append", "frame": "AAAA", "frame_id": {}, "pts_ms": 0}}',
    ],
)
def test_nesting_at_the_parsers_limit(template):
    """Values nested as deep as the JSON parser takes, where fields are read or repr'd."""
    edge = next(d for d in range(sys.getrecursionlimit(), 0, -1) if _loads(_nest(d).text))
    for depth in [*range(edge - 12, edge + 3), 5000]:  # parse is a few frames deeper
        _check(template.format(_nest(depth).text), 16 * 1024 * 1024)


def _loads(text: str) -> bool:
    try:
        json.loads(text)
    except RecursionError:
        return False
    return True
