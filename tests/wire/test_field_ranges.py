"""Field ranges: the four hostile values of the issue, and the ranges behind their fix.

Each reproduction sends the issue's exact payload through the codec of its endpoint:
it gets a ``bad_event`` naming the field, and the same session then takes the valid
form of the event (and, where a timer was at stake, a pause runs through it). Before
the fix each one raised ``OverflowError`` or ``TypeError`` out of the codec or the
session. ``test_e2e_hostile_fields.py`` sends them over real sockets.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from duplex import sessions as ds
from duplex.exceptions import BadEvent, ConfigError, ProtocolError
from duplex.wire._native import NativeProjection, parse_client_event
from duplex.wire._realtime import RealtimeProjection

from ..sessions.sessionkit import loud, machine, of, silence, speaking
from .test_realtime_turns import TONE, Session, _frame

BIG = "1" + "0" * 309  # the value: 10**309 as a JSON integer literal


def _id(value: object) -> str:
    text = repr(value)
    return text if len(text) < 20 else f"{text[:3]}_{len(text)}_digits"


def _responding(**config: object) -> ds.SessionMachine:
    m = machine(**config)
    for t in (0.0, 0.08, 0.16):
        m.handle(speaking(m, "a"), t)
    assert m.turn_state is ds.TurnState.RESPONDING
    return m


def _error(parse, text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse(text)
    return caught.value


# ------------------------------------------------------------- 1. playback.ack


@pytest.mark.parametrize(
    "codec",
    [NativeProjection(), RealtimeProjection(duplex=True)],
    ids=["duplex", "realtime?duplex=1"],
)
def test_playback_ack_with_an_overflowing_played_ms_is_bad_event(codec) -> None:
    m = _responding()
    response = m.active_response_id
    text = f'{{"type":"playback.ack","event_id":"e1","response_id":"{response}","played_ms":{BIG}}}'
    error = _error(codec.parse, text)
    assert (type(error), error.param, error.event_id) == (BadEvent, "played_ms", "e1")
    # the session never saw it; the valid ack is acknowledged
    acked = m.handle(codec.parse(text.replace(BIG, "80")), 0.3)
    assert [a.played_ms for a in of(acked, ds.PlaybackAcknowledged)] == [80.0]


# ------------------------------------------------- 2. false_interruption_timeout_s


@pytest.mark.parametrize("kind", ["session.create", "session.update"])
def test_an_overflowing_false_interruption_timeout_is_bad_event(kind: str) -> None:
    text = f'{{"type":"{kind}","event_id":"e1","session":{{"false_interruption_timeout_s":{BIG}}}}}'
    error = _error(parse_client_event, text)
    assert (type(error), error.param) == (BadEvent, "session.false_interruption_timeout_s")
    realtime = RealtimeProjection(duplex=True)
    if kind == "session.update":
        error = _error(realtime.parse, text)
        assert error.param == "session.false_interruption_timeout_s"
    # the valid update is taken, and the first pause resumes after it
    m = _responding()
    update = parse_client_event(text.replace(BIG, "2.5").replace(kind, "session.update"))
    assert of(m.handle(update, 0.2), ds.SessionUpdated)
    m.handle(loud(200), 0.3)
    assert m.turn_state is ds.TurnState.PAUSED
    m.handle(silence(800), 0.5)
    deadline = m.next_deadline()
    assert deadline is not None and deadline < 10
    m.handle(ds.Tick(), deadline)
    assert m.turn_state is ds.TurnState.RESPONDING


@pytest.mark.parametrize(
    "value",
    [10**309, -(10**309), 1e308, float("nan"), float("inf"), 86_400.5, 0, True, "2"],
    ids=_id,
)
def test_the_session_core_refuses_what_no_timer_can_hold(value: object) -> None:
    """The guard behind the parsers: options and config refuse it whoever builds them."""
    with pytest.raises(BadEvent) as caught:
        ds.SessionOptions(false_interruption_timeout_s=value)  # type: ignore[arg-type]
    assert caught.value.param == "session.false_interruption_timeout_s"
    with pytest.raises(ConfigError):
        ds.SessionConfig(false_interruption_timeout_s=value)  # type: ignore[arg-type]


def test_a_day_is_the_longest_duration_accepted() -> None:
    assert ds.SessionOptions(false_interruption_timeout_s=86_400).false_interruption_timeout_s
    config = ds.SessionConfig().apply_update(ds.SessionOptions(vad_idle_timeout_ms=86_400_000))
    assert config.vad_idle_timeout_ms == ds.MAX_DURATION_MS
    with pytest.raises(BadEvent) as caught:
        ds.SessionOptions(vad_idle_timeout_ms=86_400_001)
    assert caught.value.param == "session.vad_idle_timeout_ms"


# ------------------------------------------------------- 3. prefix_padding_ms


@pytest.mark.parametrize(
    ("schema", "session", "param"),
    [
        (
            "ga",
            '{"audio":{"input":{"turn_detection":{"type":"server_vad","prefix_padding_ms":%s}}}}',
            "session.audio.input.turn_detection.prefix_padding_ms",
        ),
        (
            "beta",
            '{"turn_detection":{"type":"server_vad","prefix_padding_ms":%s}}',
            "session.turn_detection.prefix_padding_ms",
        ),
    ],
)
def test_an_overflowing_prefix_padding_is_bad_event(schema: str, session: str, param: str) -> None:
    s = Session(schema=schema)
    s.send('{"type":"session.update","event_id":"e1","session":%s}' % (session % BIG))
    [error] = s.of("error")
    assert (error["error"]["code"], error["error"]["param"]) == ("bad_event", param)
    # the valid update is taken and speech is padded by it
    s.send('{"type":"session.update","session":%s}' % (session % 200))
    assert s.of("session.updated")
    s.stream(np.zeros(9600, dtype="<i2"))  # 400 ms of silence first
    s.stream(TONE)
    s.stream(np.zeros(24_000, dtype="<i2"))
    [started] = s.of("input_audio_buffer.speech_started")
    assert 150 <= started["audio_start_ms"] <= 250  # 400 ms less the 200 ms padding
    assert s.of("input_audio_buffer.speech_stopped")


# ------------------------------------------------------------ 4. item.role


@pytest.mark.parametrize("role", ["{}", "[]"])
def test_an_unhashable_item_role_is_bad_event(role: str) -> None:
    s = Session()
    item = '{"type":"message","role":%s,"content":[{"type":"input_text","text":"hi"}]}'
    s.send('{"type":"conversation.item.create","event_id":"e1","item":%s}' % (item % role))
    [error] = s.of("error")
    assert error["error"]["param"] == "item.role" and error["error"]["event_id"] == "e1"
    s.send('{"type":"conversation.item.create","item":%s}' % (item % '"user"'))
    assert [e["item"]["role"] for e in s.of("conversation.item.added")] == ["user"]


def test_an_unhashable_content_type_is_bad_event() -> None:
    item = {"type": "message", "role": "user", "content": [{"type": {}, "text": "hi"}]}
    error = _error(RealtimeProjection().parse, _frame("conversation.item.create", item=item))
    assert error.param == "item.content.0.type"


# ------------------------------------------------------------------- Range


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (ds.MAX_DURATION_MS, True),
        (ds.MAX_DURATION_MS + 1, False),
        (-1, False),
        (10**309, False),
        (2**63, False),
        (1.0, False),  # an integer field: a JSON float is refused
        (float("nan"), False),
        (True, False),
        (None, False),
        ("1", False),
    ],
    ids=_id,
)
def test_duration_ms_range(value: object, ok: bool) -> None:
    assert ds.DURATION_MS.accepts(value) is ok


def test_a_number_range_compares_bignums_without_converting_them() -> None:
    seconds = ds.Range(0, 86_400, integer=False, open_low=True)
    assert seconds.accepts(0.5) and seconds.accepts(86_400) and not seconds.accepts(0)
    for value in (10**309, -(10**309), float("inf"), float("-inf"), float("nan")):
        assert not seconds.accepts(value)
    with pytest.raises(BadEvent, match="a number above 0 and at most 86400") as caught:
        seconds.read(10**309, "session.x")
    assert caught.value.param == "session.x"


def test_json_literals_for_numbers_reach_the_range_as_python_builds_them() -> None:
    """What a hostile client can make Python's json build: each is refused by its range."""
    for literal in (BIG, "-" + BIG, "NaN", "Infinity", "-Infinity", "1e999", "1e308"):
        value = json.loads(literal)
        assert not ds.DURATION_MS.accepts(value)
        assert not ds.COUNT.accepts(value)
