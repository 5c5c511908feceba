"""The OpenAI Realtime projection: every server event checked against the openai SDK's
own pydantic models (strict), client frames as the SDK sends them, audio formats, fuzz."""

import base64
import contextlib
import json
import math
import typing

import numpy as np
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.resources.beta.realtime.realtime import RealtimeConnection as BetaConnection
from openai.resources.realtime.realtime import RealtimeConnection as GAConnection
from openai.types.beta.realtime import realtime_server_event as beta_events
from openai.types.realtime import realtime_server_event as ga_events

from duplex import sessions as ds
from duplex.codecs._g711 import alaw_encode, ulaw_decode, ulaw_encode
from duplex.exceptions import ProtocolError
from duplex.pcm import pcm16_to_float
from duplex.wire._json_text import dumps
from duplex.wire._realtime import (
    DUPLEX_CLIENT_EVENTS,
    DUPLEX_SERVER_EVENTS,
    REALTIME_CLIENT_EVENTS,
    UNSUPPORTED_CLIENT_EVENTS,
    RealtimeProjection,
    WireFormats,
    duplex_flag,
    parse_realtime_event,
    schema_from_headers,
)

# ------------------------------------------------------------- the SDK as oracle


def _models_by_type(union: object) -> dict[str, type[pydantic.BaseModel]]:
    """The SDK's server-event union, keyed by each member's ``type`` literal."""
    members = typing.get_args(typing.get_args(union)[0])
    out = {}
    for cls in members:
        (name,) = typing.get_args(cls.model_fields["type"].annotation)
        out[name] = cls
    return out


SDK_MODELS = {
    "ga": _models_by_type(ga_events.RealtimeServerEvent),
    "beta": _models_by_type(beta_events.RealtimeServerEvent),
}
# Fields OpenAI itself sends beyond the SDK models; nothing else may be extra without duplex.
OPENAI_EXTRAS = {"session.id", "session.object"}


def _extras(value: object, path: str = "") -> set[str]:
    """Paths of fields the SDK model kept only because it allows extras."""
    found: set[str] = set()
    if isinstance(value, pydantic.BaseModel):
        found |= {f"{path}{key}" for key in value.model_extra or {}}
        for name in type(value).model_fields:
            found |= _extras(getattr(value, name), f"{path}{name}.")
    elif isinstance(value, list):
        for item in value:
            found |= _extras(item, path)
    return found


def check_wire(event: dict, *, schema: str, duplex: bool) -> None:
    """Strictly validate one encoded event against the SDK, as a client would see it."""
    obj = json.loads(json.dumps(event))  # the JSON wire: no tuples, no numpy scalars
    assert obj == event
    models = SDK_MODELS[schema]
    if obj["type"] not in models:
        assert duplex, f"{obj['type']} is not an OpenAI {schema} event and duplex is off"
        assert obj["type"] in DUPLEX_SERVER_EVENTS
        return
    model = models[obj["type"]].model_validate(obj, strict=True)
    extras = _extras(model)
    if not duplex:
        assert extras <= OPENAI_EXTRAS, f"{obj['type']} has non-OpenAI fields {extras}"
        assert "server_event_seq" not in obj


def test_the_sdk_oracle_is_strict():
    """A missing or mistyped field must fail, or the checks below prove nothing."""
    proj = RealtimeProjection()
    (delta,) = proj.encode(ds.AudioDelta("r", "i", 0, b"\x01\x00", 24000, 0.0), 3)
    check_wire(delta, schema="ga", duplex=False)
    for broken in (
        {k: v for k, v in delta.items() if k != "item_id"},
        {**delta, "output_index": "0"},
        {**delta, "delta": None},
    ):
        with pytest.raises(pydantic.ValidationError):
            SDK_MODELS["ga"][delta["type"]].model_validate(broken, strict=True)
    started = {"type": "input_audio_buffer.speech_started", "event_id": "e", "item_id": ""}
    with pytest.raises(pydantic.ValidationError):  # strict ints: a fractional ms is a bug
        SDK_MODELS["ga"][started["type"]].model_validate(
            {**started, "audio_start_ms": 1.5}, strict=True
        )
    with pytest.raises(AssertionError):
        check_wire({**delta, "surprise": 1}, schema="ga", duplex=False)


# --------------------------------------------------------------- sample events

PCM = (np.sin(np.arange(480) / 24000 * 2 * np.pi * 440) * 8000).astype("<i2").tobytes()


CALL_FIELDS = {
    "item_id": "item_f2",
    "role": "assistant",
    "order": 9,
    "audio_ms": 0.0,
    "text": '{"city":"Paris"}',
    "content": "function_call",
    "call_id": "call_9",
    "name": "get_weather",
}
CALL = ds.HistoryItem(**CALL_FIELDS)


def session_story(config: ds.SessionConfig | None = None) -> list:
    """One of each server event, with the variants that change the projection
    (``config``: the session's, whose audio codecs every config here shares)."""
    caps, config = ds.Capabilities(), config or ds.SessionConfig()
    codecs = {
        "input_audio_codec": config.input_audio_codec,
        "output_audio_codec": config.output_audio_codec,
        "input_sample_rate": config.input_sample_rate,
    }
    off = ds.SessionConfig(turn_detection="none", **codecs)
    turn_based = ds.SessionConfig(
        **codecs,
        turn_policy="turn_based",
        vad_interrupt_response=False,
        vad_create_response=True,
        vad_idle_timeout_ms=5000,
        vad_threshold=1,
        vad_prefix_padding_ms=300,
    )
    agent = ds.SessionConfig(
        **codecs,
        instructions="Be brief.",
        voice="marin",
        input_transcription=ds.Transcription("whisper-1", "en", "names"),
        output_modalities="text",
        temperature=0.7,
        max_output_tokens=200,
        tools=(ds.FunctionTool.of("get_weather", "Weather now", {"type": "object"}),),
        tool_choice="auto",
    )
    text_oob = agent.response_settings(
        ds.ResponseOptions(conversation="none", metadata=(("purpose", "title"),))
    )
    story = [
        ds.SessionCreated("duplex-abc", config, caps, "tok", 1, 0),
        ds.SessionUpdated("duplex-abc", config),
        ds.SessionUpdated("duplex-abc", off),
        ds.SessionUpdated("duplex-abc", turn_based),
        ds.InputSpeechStarted(120.4, "item_u1"),
        ds.InputSpeechStopped(980.6, "item_u1"),
        ds.InputTranscriptionDelta("item_u1", "hello"),
        ds.InputTranscriptionCompleted("item_u1", "hello there", 0.98),
        ds.InputTranscriptionFailed("item_u2", "transcription_failed", "The ASR was lost."),
        ds.InputAudioCommitted("item_u1", 1, 980.6),
        ds.InputAudioCommitted("item_u2", 2, 1980.6, "item_u1"),
        ds.InputAudioTimeout(1980.6, 6980.6, "item_u3"),
        ds.InputAudioCleared(2),
        ds.ItemAdded(ds.HistoryItem("item_t", "user", 3, 0.0, "hello", "text")),
        ds.ItemAdded(ds.HistoryItem("item_s", "system", 0.5, 0.0, "be brief", "text"), None),
        ds.ItemAdded(ds.HistoryItem("item_a", "assistant", 4, 0.0, "hi", "text"), "item_t"),
        ds.ItemAdded(ds.HistoryItem("item_v", "user", 5, 480.0), "item_a"),
        ds.ItemRetrieved(ds.HistoryItem("item_r", "assistant", 6, 480.0, "[0][80]")),
        ds.ItemRetrieved(ds.HistoryItem("item_v", "user", 5, 480.0)),
        ds.ItemDeleted("item_t"),
        ds.ItemTruncated("item_r", 0, 80),
        ds.ResponseCreated("resp_1", "item_a1", 0),
        ds.AudioDelta("resp_1", "item_a1", 0, PCM, 24000, 0.0),
        ds.TranscriptDelta("resp_1", "item_a1", 0, "hi", 0.0),
        ds.ErrorEvent("bad_event", "invalid_request_error", "nope", "evt_1", "session.x"),
        ds.ErrorEvent("internal_error", "server_error", "boom"),
        ds.ResponseListen(1, "model_listen"),
        ds.OverlapDecision(
            "barge_in_on_speech", "barge_in", "speech_over_barge_in_ms", 1200.0, "r"
        ),
        ds.PlaybackAcknowledged("resp_1", "item_a1", 400.0, 400.0, 800.0, 800.0, True),
        ds.SessionResumed("duplex-abc", "tok2", 2, 1, 3, 17, config),
        ds.SessionReplaced("duplex-abc", 3),
        ds.SessionResyncRequired("duplex-abc", "journal_gap", 17),
        ds.SessionReady("duplex-abc"),
        ds.SessionExpired("duplex-abc", "idle_ttl_expired"),
        ds.SessionClosed("duplex-abc", "client_close"),
        ds.VideoConsumed(("f1",), 40),
        ds.SessionUpdated("duplex-abc", agent),
        ds.ItemAdded(
            ds.HistoryItem(
                "item_c",
                "assistant",
                7,
                0.0,
                '{"city":"Paris"}',
                "function_call",
                call_id="call_1",
                name="get_weather",
            ),
            "item_a",
        ),
        ds.ItemAdded(
            ds.HistoryItem(
                "item_o", "tool", 8, 0.0, '{"temp":21}', "function_call_output", call_id="call_1"
            ),
            "item_c",
        ),
        ds.ItemRetrieved(
            ds.HistoryItem("item_o", "tool", 8, 0.0, "{}", "function_call_output", call_id="c")
        ),
        ds.ResponseCreated("resp_t", "item_t1", 0, text_oob),
        ds.TextDelta("resp_t", "item_t1", 0, "It is 21"),
        ds.ResponseDone(
            "resp_t", "item_t1", 0, "completed", "end_of_turn", "It is 21", 0.0, text_oob
        ),
        ds.ResponseDone(
            "resp_t",
            "item_t1",
            0,
            "incomplete",
            "max_output_tokens",
            "It",
            0.0,
            agent.response_settings(),
        ),
        ds.FunctionCallDelta(
            "resp_f", 0, 1, ds.HistoryItem(**{**CALL_FIELDS, "text": ""}), "", True
        ),
        ds.FunctionCallDelta("resp_f", 0, 1, CALL, CALL.text),
        ds.FunctionCallDone("resp_f", 0, 1, CALL),
        ds.FunctionCallDelta("resp_g", 0, 1, CALL, CALL.text, True, False),
        ds.FunctionCallDone("resp_g", 0, 1, ds.HistoryItem(**{**CALL_FIELDS, "text": ""}), False),
        ds.FunctionCallDone("resp_h", 0, 1, CALL, True, False),  # cut off before its end
        ds.ResponseDone("resp_f", "item_f1", 0, "completed", "end_of_turn", "", 0.0, calls=(CALL,)),
    ]
    for status, reason in (
        ("completed", "end_of_turn"),
        ("completed", "turn_detected"),
        ("cancelled", "barge_in"),
        ("cancelled", "turn_detected"),
        ("cancelled", "client_cancelled"),
        ("cancelled", "input_cleared"),
        ("incomplete", "session_expired"),
        ("failed", "engine_error"),
    ):
        story.append(ds.ResponseDone("resp_1", "item_a1", 0, status, reason, "hi there", 20.0))
    return story


def test_the_story_covers_every_server_event():
    assert {type(e) for e in session_story()} == set(ds.SERVER_EVENT_TYPES)


def _projection(schema: str, duplex: bool, output: str) -> RealtimeProjection:
    """A projection whose output format was set the way its schema's clients set it."""
    proj = RealtimeProjection(schema=schema, duplex=duplex, model="loopback")
    ga_name = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
    update = (
        {"type": "realtime", "audio": {"output": {"format": {"type": ga_name[output]}}}}
        if schema == "ga"
        else {"output_audio_format": output}
    )
    event = proj.parse(json.dumps({"type": "session.update", "session": update}))
    answer(proj, event)
    assert proj.formats.output == output
    return proj


def answer(proj: RealtimeProjection, update: ds.SessionUpdate, seq: int | None = None) -> None:
    """Carry the session's answer to ``update`` (from the default config) through ``proj``."""
    config = ds.SessionConfig().apply_update(update.options)
    proj.frames(ds.SessionUpdated("duplex-abc", config), seq)


@pytest.mark.parametrize("output", ["pcm16", "g711_ulaw", "g711_alaw"])
@pytest.mark.parametrize("duplex", [False, True])
@pytest.mark.parametrize("schema", ["ga", "beta"])
def test_every_encoded_event_validates_against_the_sdk(schema, duplex, output):
    proj = _projection(schema, duplex, output)
    seen = set()
    config = ds.SessionConfig(output_audio_codec=output)
    for seq, event in enumerate(session_story(config), start=1):
        wire = proj.encode(event, seq)
        if isinstance(event, ds.AudioDelta) and duplex:
            assert wire[0]["format"] == output
        for item in wire:
            check_wire(item, schema=schema, duplex=duplex)
            assert item["event_id"].startswith("event_")
            seen.add(item["type"])
        if duplex and wire:  # the cursor marks the end of the group
            assert [w.get("server_event_seq") for w in wire] == [None] * (len(wire) - 1) + [seq]
    assert seen & set(DUPLEX_SERVER_EVENTS) == (set(DUPLEX_SERVER_EVENTS) if duplex else set())
    delta, transcript = (
        ("response.output_audio.delta", "response.output_audio_transcript.delta")
        if schema == "ga"
        else ("response.audio.delta", "response.audio_transcript.delta")
    )
    assert {delta, transcript} <= seen
    assert ("conversation.item.added" in seen) == (schema == "ga")


def _types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def test_response_lifecycle_order_ga_and_beta():
    created, done = ds.ResponseCreated("r", "i", 0), session_story()[-8]
    ga, beta = RealtimeProjection(schema="ga"), RealtimeProjection(schema="beta")
    opened = ["response.created", "response.output_item.added", "conversation.item.added",
              "response.content_part.added"]  # fmt: skip
    assert _types(ga.encode(created, 1)) == opened
    opened[2] = "conversation.item.created"  # beta announces an item once
    assert _types(beta.encode(created, 1)) == opened
    assert _types(ga.encode(done, 2)) == [
        "response.output_audio.done", "response.output_audio_transcript.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done",
        "response.done", "rate_limits.updated",
    ]  # fmt: skip
    assert _types(beta.encode(done, 2)) == [
        "response.audio.done", "response.audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "response.done", "rate_limits.updated",
    ]  # fmt: skip
    assert ga.encode(done, 2)[-1]["rate_limits"] == []  # nothing is metered (see the encoder)
    assert _types(ga.encode(ds.InputAudioCommitted("u", 1, 5.0), 3)) == [
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
    ]  # fmt: skip
    assert _types(beta.encode(ds.InputAudioCommitted("u", 1, 5.0), 3)) == [
        "input_audio_buffer.committed", "conversation.item.created",
    ]  # fmt: skip


def test_response_done_status_details():
    proj = RealtimeProjection()
    by_reason = {}
    for event in session_story():
        if isinstance(event, ds.ResponseDone):
            response = proj.encode(event, 1)[-2]["response"]
            by_reason[event.reason] = (response["status"], response["status_details"])
    assert by_reason["barge_in"] == ("cancelled", {"type": "cancelled", "reason": "turn_detected"})
    assert by_reason["turn_detected"] == by_reason["barge_in"]
    assert by_reason["client_cancelled"][1]["reason"] == "client_cancelled"
    assert by_reason["end_of_turn"] == ("completed", {"type": "completed"})
    assert by_reason["engine_error"][1]["error"] == {"type": "server_error", "code": "engine_error"}
    item = proj.encode(session_story()[-5], 1)[-2]["response"]["output"][0]
    assert item["status"] == "incomplete" and item["content"][0]["transcript"] == "hi there"


def test_error_envelope():
    proj = RealtimeProjection()
    (err,) = proj.encode(ds.ErrorEvent("bad_event", "invalid_request_error", "m", "ev", "p"), 4)
    assert err["type"] == "error" and err["event_id"].startswith("event_")
    assert err["error"] == {
        "type": "invalid_request_error",
        "code": "bad_event",
        "message": "m",
        "param": "p",
        "event_id": "ev",
    }


def test_duplex_extras_only_with_duplex():
    created = ds.SessionCreated("duplex-abc", ds.SessionConfig(), ds.Capabilities(), "tok", 1, 0)
    plain = RealtimeProjection().encode(created, None)
    duplex = RealtimeProjection(duplex=True).encode(created, None)
    assert [e["type"] for e in plain] == ["session.created", "conversation.created"]
    assert "capabilities" not in plain[0]["session"] and "resume_token" not in plain[0]
    assert duplex[0]["session"]["capabilities"]["supports_barge_in"] is True
    assert duplex[0]["resume_token"] == "tok" and duplex[0]["attachment_generation"] == 1
    assert duplex[-1]["server_event_seq"] is None
    assert plain[0]["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    beta = RealtimeProjection(schema="beta").encode(created, None)[0]["session"]
    assert beta["input_audio_format"] == "pcm16" and "audio" not in beta
    for event in session_story():
        if type(event).__name__ in (
            "ResponseListen", "OverlapDecision", "PlaybackAcknowledged", "SessionResumed",
            "SessionReplaced", "SessionResyncRequired", "SessionExpired", "SessionClosed",
            "VideoConsumed",
        ):  # fmt: skip
            assert RealtimeProjection().encode(event, 1) == []
            assert len(RealtimeProjection(duplex=True).encode(event, 1)) == 1


# ------------------------------------------------------------------ client side


class _Recorder:
    """Stands in for the SDK's websocket: records exactly what the SDK would send."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, data: str) -> None:
        self.sent.append(data)

    def close(self, *args: object, **kwargs: object) -> None:
        pass


def _sdk_frames(schema: str) -> list[str]:
    ws = _Recorder()
    conn = GAConnection(ws) if schema == "ga" else BetaConnection(ws)
    ga_audio = {
        "input": {"format": {"type": "audio/pcmu"}},
        "output": {"format": {"type": "audio/pcma"}},
    }
    session = (
        {"type": "realtime", "output_modalities": ["audio"], "audio": ga_audio}
        if schema == "ga"
        else {"modalities": ["text", "audio"], "input_audio_format": "g711_ulaw",
              "output_audio_format": "g711_alaw"}
    )  # fmt: skip
    conn.session.update(session=session, event_id="evt_update")
    conn.input_audio_buffer.append(audio=base64.b64encode(bytes([0xFF, 0x80, 0x00])).decode())
    conn.input_audio_buffer.commit()
    conn.input_audio_buffer.clear()
    conn.response.create()
    conn.response.cancel(response_id="resp_1")
    conn.output_audio_buffer.clear()
    conn.conversation.item.truncate(item_id="i", content_index=0, audio_end_ms=10, event_id="t1")
    return ws.sent


@pytest.mark.parametrize("schema", ["ga", "beta"])
def test_frames_the_sdk_sends(schema):
    proj = RealtimeProjection(schema=schema)
    frames = _sdk_frames(schema)
    update = proj.parse(frames[0])
    assert isinstance(update, ds.SessionUpdate) and update.event_id == "evt_update"
    assert update.options.input_sample_rate == 8000
    assert proj.paused  # another input format: the session's answer decides the next append
    with pytest.raises(RuntimeError):
        proj.parse(frames[1])
    answer(proj, update)
    assert not proj.paused
    assert proj.formats == WireFormats(input="g711_ulaw", output="g711_alaw")
    append = proj.parse(frames[1])
    assert isinstance(append, ds.AudioAppend) and append.sample_rate == 8000
    assert append.pcm.tolist() == pcm16_to_float(ulaw_decode(bytes([0xFF, 0x80, 0x00]))).tolist()
    kinds = [type(proj.parse(f)) for f in frames[2:7]]
    expected = [ds.AudioCommit, ds.AudioClear, ds.ResponseCreate, ds.ResponseCancel]
    assert kinds == [*expected, ds.ResponseCancel]  # output_audio_buffer.clear cancels
    assert proj.parse(frames[5]).response_id == "resp_1"
    truncate = proj.parse(frames[7])
    assert truncate == ds.ItemTruncate("i", 0, 10, "t1")


def _error(text: str, **kw) -> tuple[str, str | None]:
    with pytest.raises(ProtocolError) as info:
        RealtimeProjection(**kw).parse(text)
    return info.value.code, info.value.param


def _update(session: object, **kw) -> tuple[str, str | None]:
    return _error(json.dumps({"type": "session.update", "session": session}), **kw)


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        (
            {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
            "unsupported_turn_detection",
            "session.audio.input.turn_detection.type",
        ),
        (
            {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}},
            "unsupported_turn_detection",
            "session.turn_detection.type",
        ),
        ({"turn_detection": {"type": "magic"}}, "bad_event", "session.turn_detection.type"),
        ({"turn_detection": {}}, "bad_event", "session.turn_detection.type"),
        ({"turn_detection": "server_vad"}, "bad_event", "session.turn_detection"),
        ({"turn_detection": {"type": "server_vad", "threshold": 1.5}}, "bad_event",
         "session.turn_detection.threshold"),
        ({"turn_detection": {"type": "server_vad", "threshold": True}}, "bad_event",
         "session.turn_detection.threshold"),
        ({"turn_detection": {"type": "server_vad", "silence_duration_ms": 0}}, "bad_event",
         "session.turn_detection.silence_duration_ms"),
        ({"turn_detection": {"type": "server_vad", "prefix_padding_ms": 2.5}}, "bad_event",
         "session.turn_detection.prefix_padding_ms"),
        ({"turn_detection": {"type": "server_vad", "create_response": 1}}, "bad_event",
         "session.turn_detection.create_response"),
        ({"turn_detection": {"type": "server_vad", "idle_timeout_ms": -1}}, "bad_event",
         "session.turn_detection.idle_timeout_ms"),
        ({"turn_detection": {"type": "server_vad", "eagerness": "low"}}, "bad_event",
         "session.turn_detection.eagerness"),
        ({"turn_detection": None, "audio": {"input": {"turn_detection": None}}}, "bad_event",
         "session.audio.input.turn_detection"),
        ({"instructions": 5}, "bad_event", "session.instructions"),
        ({"audio": {"output": {"voice": "robot"}}}, "bad_event", "session.audio.output.voice"),
        ({"voice": "robot"}, "bad_event", "session.voice"),
        ({"output_modalities": ["video"]}, "bad_event", "session.output_modalities"),
        ({"modalities": "audio"}, "bad_event", "session.modalities"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "unsupported_parameter",
         "session.tools.0.type"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "bad_event", "session.tools.0.name"),
        ({"tool_choice": "required"}, "unsupported_parameter", "session.tool_choice"),
        ({"tool_choice": {"type": "function", "name": "f"}}, "unsupported_parameter",
         "session.tool_choice"),
        ({"max_output_tokens": 0}, "bad_event", "session.max_output_tokens"),
        ({"max_response_output_tokens": 5000}, "bad_event",
         "session.max_response_output_tokens"),
        ({"temperature": 3}, "bad_event", "session.temperature"),
        ({"speed": 1.2}, "unsupported_parameter", "session.speed"),
        ({"input_audio_transcription": {"model": ""}}, "bad_event",
         "session.input_audio_transcription.model"),
        ({"input_audio_transcription": {"model": "whisper-1", "delay": "low"}}, "bad_event",
         "session.input_audio_transcription.delay"),
        ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, "unsupported_parameter",
         "session.audio.input.noise_reduction"),
        ({"type": "transcription"}, "unsupported_parameter", "session.type"),
        ({"type": "other"}, "bad_event", "session.type"),
        ({"model": "gpt-realtime"}, "unsupported_parameter", "session.model"),
        ({"surprise": 1}, "bad_event", "session.surprise"),
        ({"audio": {"input": {"surprise": 1}}}, "bad_event", "session.audio.input.surprise"),
        ({"audio": {"sideways": {}}}, "bad_event", "session.audio.sideways"),
        ({"input_audio_format": "opus"}, "unsupported_audio_format", "session.input_audio_format"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}},
         "unsupported_audio_format", "session.audio.input.format.rate"),
        ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
         "unsupported_audio_format", "session.audio.output.format.rate"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 8000}}}},
         "unsupported_audio_format", "session.audio.input.format.rate"),
        ({"audio": {"input": {"format": {"rate": 24000}}}}, "bad_event",
         "session.audio.input.format.type"),
        ({"input_audio_format": "pcm16", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
         "bad_event", "session.audio.input.format"),
        ({"overlap_policy": "model"}, "bad_event", "session.overlap_policy"),
        ("nope", "bad_event", "session"),
    ],
)  # fmt: skip
def test_session_fields_are_used_restated_or_refused(session, code, param):
    assert _update(session) == (code, param)


def test_session_fields_that_restate_the_session_are_accepted():
    proj = RealtimeProjection(model="loopback")
    for session in (
        {"type": "realtime", "model": "loopback", "output_modalities": ["audio"]},
        {"modalities": ["audio", "text"], "tools": [], "tool_choice": "auto", "tracing": None},
        {"max_response_output_tokens": "inf", "speed": 1.0, "input_audio_noise_reduction": None},
        {"audio": {"input": {"transcription": None, "format": {"type": "audio/pcm"}}}},
    ):
        event = proj.parse(json.dumps({"type": "session.update", "session": session}))
        assert isinstance(event, ds.SessionUpdate)
    assert proj.formats == WireFormats()


def test_refused_update_leaves_formats_alone():
    proj = RealtimeProjection()
    text = json.dumps(
        {"type": "session.update", "session": {"input_audio_format": "g711_alaw", "voice": "x"}}
    )
    with pytest.raises(ProtocolError):
        proj.parse(text)
    assert proj.formats == WireFormats()


def test_duplex_session_fields():
    session = {"overlap_policy": "model", "overlap_short_ack_ms": 500, "overlap_barge_in_ms": 900}
    event = RealtimeProjection(duplex=True).parse(
        json.dumps({"type": "session.update", "session": session})
    )
    assert (event.options.overlap_policy, event.options.short_ack_ms) == ("model", 500)
    assert event.options.barge_in_ms == 900
    bad = {"overlap_short_ack_ms": True}
    assert _update(bad, duplex=True) == ("bad_event", "session.overlap_short_ack_ms")
    assert _update({"overlap_barge_in_ms": 0}, duplex=True) == (
        "bad_event",
        "session.overlap_barge_in_ms",
    )


def test_top_level_and_event_errors():
    assert _error('{"type": "input_audio_buffer.commit", "final": true}') == ("bad_event", "final")
    assert _error('{"type": "nope"}') == ("unknown_event", "type")
    assert _error('{"type": 3}') == ("bad_event", "type")
    assert _error("[1]")[0] == "bad_event"
    assert _error("{")[0] == "invalid_json"
    assert _error(b"\x00")[0] == "binary_frame_unsupported"
    assert _error("x" * 200, max_size=100)[0] == "event_too_large"
    assert _error('{"type": "input_audio_buffer.append", "audio": "***"}') == ("bad_audio", "audio")
    assert _error('{"type": "input_audio_buffer.append", "audio": "AQ=="}') == (
        "bad_audio",
        "audio",
    )
    assert _error('{"type": "input_audio_buffer.append"}') == ("bad_event", "audio")
    assert _error('{"type": "response.cancel", "response_id": 5}') == ("bad_event", "response_id")
    create = {"type": "response.create", "response": {"prompt": {"id": "p"}}}
    assert _error(json.dumps(create)) == ("unsupported_parameter", "response.prompt")
    ok = {"type": "response.create", "response": {"output_modalities": ["audio"]}}
    assert isinstance(parse_realtime_event(json.dumps(ok)), ds.ResponseCreate)
    for kind in UNSUPPORTED_CLIENT_EVENTS:
        text = json.dumps({"type": kind, "event_id": "e1"})
        with pytest.raises(ProtocolError) as info:
            parse_realtime_event(text, schema="beta")
        assert (info.value.code, info.value.event_id) == ("unsupported_event", "e1")
        assert kind in info.value.message


def test_duplex_client_events_need_duplex():
    frames = {
        "playback.ack": ({"response_id": "r", "played_ms": 120}, ds.PlaybackAck),
        "turn.signal": ({"event": "barge_in"}, ds.TurnSignal),
        "session.resume": ({"session_id": "s", "resume_token": "t"}, ds.SessionResume),
        "session.event_ack": ({"server_event_seq": 3}, ds.EventAck),
        "session.close": ({}, ds.SessionClose),
        "input_video.append": ({"frame": "AAAA", "frame_id": "f1", "pts_ms": 0}, ds.VideoAppend),
    }
    assert set(frames) == set(DUPLEX_CLIENT_EVENTS)
    for kind, (fields, cls) in frames.items():
        text = json.dumps({"type": kind, "event_id": "e", **fields})
        assert _error(text) == ("unknown_event", "type")
        assert isinstance(parse_realtime_event(text, duplex=True), cls)


def test_every_duplex_event_has_a_server_event_seq_key():
    """Connection-scoped events say ``null``; only the last event of a group has the seq."""
    created = ds.SessionCreated("duplex-abc", ds.SessionConfig(), ds.Capabilities(), "tok", 1, 0)
    proj = RealtimeProjection(duplex=True)
    for event, seq in ((created, None), (ds.ResponseCreated("r", "i", 0), 7)):
        wire = proj.encode(event, seq)
        assert all("server_event_seq" in w for w in wire), [w["type"] for w in wire]
        assert [w["server_event_seq"] for w in wire] == [None] * (len(wire) - 1) + [seq]
    assert all("server_event_seq" not in w for w in RealtimeProjection().encode(created, None))


def test_video_is_the_native_event_with_duplex():
    """``supports_video_input`` is advertised under ``?duplex=1``; the event is accepted there."""
    frame = {"type": "input_video.append", "event_id": "v1", "frame": "AAAA", "frame_id": "f1",
             "pts_ms": 40}  # fmt: skip
    event = RealtimeProjection(duplex=True).parse(json.dumps(frame))
    assert isinstance(event, ds.VideoAppend)
    assert (event.frame, event.frame_id, event.pts_ms, event.event_id) == (bytes(3), "f1", 40, "v1")
    assert _error(json.dumps(frame)) == ("unknown_event", "type")
    assert _error(json.dumps({**frame, "frame": "*"}), duplex=True)[0] == "invalid_video_frames"


def test_handshake_helpers():
    assert schema_from_headers(None) == "ga"
    assert schema_from_headers("realtime=v1") == "beta"
    assert schema_from_headers("assistants=v2, realtime=v1") == "beta"
    assert schema_from_headers("assistants=v2") == "ga"
    assert [duplex_flag(v) for v in (None, "1", "true", "ON", "0", "off")] == [
        False, True, True, True, False, False,
    ]  # fmt: skip
    with pytest.raises(ProtocolError):
        duplex_flag("yes please")


# ----------------------------------------------------------------- audio paths


def test_pcm16_in_and_out_are_lossless():
    pcm = np.array([0, 1, -1, 32767, -32768], dtype="<i2")
    frame = {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm.tobytes()).decode()}
    event = parse_realtime_event(json.dumps(frame))
    assert event.sample_rate == 24000
    assert event.pcm.tolist() == (pcm / 32768.0).astype(np.float32).tolist()
    (delta,) = RealtimeProjection().encode(ds.AudioDelta("r", "i", 0, PCM, 24000, 0.0), 1)
    assert base64.b64decode(delta["delta"]) == PCM


@pytest.mark.parametrize(
    ("fmt", "encode"), [("g711_ulaw", ulaw_encode), ("g711_alaw", alaw_encode)]
)
def test_g711_input_decodes_at_8k(fmt, encode):
    pcm = (np.sin(np.arange(160) / 8000 * 2 * np.pi * 300) * 12000).astype(np.int16)
    frame = {"type": "input_audio_buffer.append", "audio": base64.b64encode(encode(pcm)).decode()}
    event = parse_realtime_event(json.dumps(frame), formats=WireFormats(input=fmt))
    assert event.sample_rate == 8000 and event.pcm.size == 160
    assert np.max(np.abs(event.pcm - pcm / 32768.0)) < 0.035 * 12000 / 32768 + 1e-3


@pytest.mark.parametrize(("fmt", "decode_name"), [("g711_ulaw", "ulaw"), ("g711_alaw", "alaw")])
def test_g711_output_is_resampled_seamlessly(fmt, decode_name):
    from duplex.codecs import _g711

    decode = getattr(_g711, f"{decode_name}_decode")
    tone = (np.sin(np.arange(24000) / 24000 * 2 * np.pi * 440) * 16000).astype("<i2")
    proj = RealtimeProjection(formats=WireFormats(output=fmt))

    def stream() -> np.ndarray:
        proj.encode(ds.ResponseCreated("r", "i", 0), 1)  # fresh filter state per response
        out = []
        for start in range(0, tone.size, 480):  # 20 ms deltas
            chunk = tone[start : start + 480].tobytes()
            for ev in proj.encode(ds.AudioDelta("r", "i", 0, chunk, 24000, start / 24.0), 2):
                out.append(decode(base64.b64decode(ev["delta"])))
        return np.concatenate(out)

    first, second = stream(), stream()
    assert first.size == 8000 and np.array_equal(first, second)
    whole = ds.StreamingResampler(24000, 8000).process(pcm16_to_float(tone))
    expected = decode(
        getattr(_g711, f"{decode_name}_encode")(np.round(whole * 32768).astype(np.int16))
    )
    assert np.array_equal(first, expected)  # chunking changes nothing
    ideal = np.sin(np.arange(8000) / 8000 * 2 * np.pi * 440) * 16000
    lag = round(ds.StreamingResampler(24000, 8000).delay_samples)
    steady = slice(100, 8000 - 100)
    corr = np.corrcoef(first[steady][lag:], ideal[steady][: -lag or None])[0, 1]
    assert corr > 0.99


@settings(max_examples=150, deadline=None)
@given(
    schema=st.sampled_from(["ga", "beta"]),
    duplex=st.booleans(),
    output=st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw"]),
    rate=st.sampled_from([24000, 16000]),
    chunks=st.lists(st.binary(max_size=400).map(lambda b: b[: len(b) // 2 * 2]), max_size=4),
    ids=st.tuples(st.text(max_size=8), st.text(max_size=8)),
    epoch=st.integers(min_value=0, max_value=2**64),
    start=st.floats() | st.integers(min_value=0, max_value=2**40),
    seq=st.none() | st.integers(min_value=1, max_value=2**64),
)
def test_audio_delta_frames_write_what_encode_dumps(
    schema, duplex, output, rate, chunks, ids, epoch, start, seq
):
    """The per-frame template's text is `dumps` of `encode`'s dicts, resampler state and all."""

    def fixed(n: int) -> bytes:
        return bytes(range(n))

    by_text, by_dict = (
        RealtimeProjection(
            schema=schema, duplex=duplex, formats=WireFormats(output=output), random_bytes=fixed
        )
        for _ in range(2)
    )
    for chunk in chunks:
        event = ds.AudioDelta(*ids, epoch, chunk, rate, start)
        texts = by_text.frames(event, seq)
        assert texts == [dumps(wire) for wire in by_dict.encode(event, seq)]
        if math.isfinite(start):
            for text in texts:
                check_wire(json.loads(text), schema=schema, duplex=duplex)


# ------------------------------------------------------------------------ fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
SESSION_KEYS = [
    "type", "model", "audio", "input", "output", "format", "rate", "turn_detection",
    "threshold", "silence_duration_ms", "create_response", "role", "content", "text", "id",
    "input_audio_format", "output_audio_format", "modalities", "output_modalities", "voice",
    "speed", "tools", "tool_choice", "tracing", "instructions", "overlap_policy",
    "overlap_short_ack_ms", "transcription", "noise_reduction", "max_output_tokens",
]  # fmt: skip
session_values = st.recursive(
    json_values
    | st.sampled_from(
        [
            "realtime",
            "audio/pcmu",
            "pcm16",
            "g711_alaw",
            "inf",
            24000,
            "server_vad",
            "message",
            "user",
            "input_text",
            "input_audio",
            "assistant",
        ]
    ),
    lambda inner: (
        st.dictionaries(st.sampled_from(SESSION_KEYS), inner, max_size=4)
        | st.lists(inner, max_size=2)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.text(max_size=200), st.binary(max_size=200)), duplex=st.booleans())
def test_fuzz_arbitrary_frames_only_raise_protocol_errors(data, duplex):
    with contextlib.suppress(ProtocolError):  # anything else fails the test
        parse_realtime_event(data, duplex=duplex, max_size=150)


@settings(max_examples=500, deadline=None)
@given(
    kind=st.sampled_from(
        REALTIME_CLIENT_EVENTS + DUPLEX_CLIENT_EVENTS + tuple(UNSUPPORTED_CLIENT_EVENTS)
    ),
    fields=st.dictionaries(
        st.sampled_from(["event_id", "session", "audio", "response", "response_id", "played_ms",
                         "event", "session_id", "resume_token", "server_event_seq", "item",
                         "item_id", "content_index", "audio_end_ms", "previous_item_id"]),
        session_values | st.sampled_from(["AAAA", "AQA=", "/w==", "barge_in"]),
        max_size=4,
    ),
    duplex=st.booleans(),
    schema=st.sampled_from(["ga", "beta"]),
    fmt=st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw"]),
)  # fmt: skip
def test_fuzz_structured_events_only_raise_protocol_errors(kind, fields, duplex, schema, fmt):
    proj = RealtimeProjection(schema=schema, duplex=duplex, formats=WireFormats(input=fmt))
    try:
        event = proj.parse(json.dumps({"type": kind, **fields}))
    except ProtocolError as exc:
        assert exc.code and exc.message
        if isinstance(fields.get("event_id"), str):
            assert exc.event_id == fields["event_id"]
    else:
        assert kind not in UNSUPPORTED_CLIENT_EVENTS
        assert duplex or kind not in DUPLEX_CLIENT_EVENTS
        if isinstance(event, ds.AudioAppend):
            assert event.sample_rate == (24000 if fmt == "pcm16" else 8000)


@pytest.mark.parametrize("schema", ["ga", "beta"])
def test_a_streamed_tool_call_opens_grows_and_closes(schema):
    proj = RealtimeProjection(schema=schema, duplex=True)
    empty = ds.HistoryItem(**{**CALL_FIELDS, "text": ""})
    pieces = ['{"city', '": "Par', 'is"}']
    events = [ds.FunctionCallDelta("r", 0, 1, empty, "", True)]
    text = ""
    for piece in pieces:
        text += piece
        events.append(
            ds.FunctionCallDelta("r", 0, 1, ds.HistoryItem(**{**CALL_FIELDS, "text": text}), piece)
        )
    events.append(ds.FunctionCallDone("r", 0, 1, ds.HistoryItem(**{**CALL_FIELDS, "text": text})))
    wire = [w for seq, e in enumerate(events, 1) for w in proj.encode(e, seq)]
    for item in wire:
        check_wire(item, schema=schema, duplex=True)
    added, done = ("conversation.item.added", "conversation.item.done") if schema == "ga" else (
        "conversation.item.created", None)  # fmt: skip
    assert _types(wire) == [
        "response.output_item.added", added,
        *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done", *([done] if done else []),
        "response.output_item.done",
    ]  # fmt: skip
    deltas = [w["delta"] for w in wire if w["type"] == "response.function_call_arguments.delta"]
    (closing,) = [w for w in wire if w["type"] == "response.function_call_arguments.done"]
    assert deltas == pieces and "".join(deltas) == closing["arguments"] == text
    assert wire[-1]["item"]["status"] == "completed"


def test_a_tool_call_cut_off_is_incomplete_and_leaves_the_conversation():
    proj = RealtimeProjection(schema="ga", duplex=True)
    cut = ds.HistoryItem(**{**CALL_FIELDS, "text": '{"ci'})
    wire = proj.encode(ds.FunctionCallDone("r", 0, 1, cut, True, False), 1)
    for item in wire:
        check_wire(item, schema="ga", duplex=True)
    assert _types(wire) == [
        "response.function_call_arguments.done",
        "conversation.item.deleted",
        "response.output_item.done",
    ]
    assert wire[-1]["item"]["status"] == "incomplete"


def test_a_clean_close_of_a_turn_based_client_ends_its_session() -> None:
    """It cannot resume; a ``?duplex=1`` client can, and an abnormal close may be a fault."""
    from duplex.sessions import SessionClose

    turn_based, resumable = RealtimeProjection(), RealtimeProjection(duplex=True)
    assert isinstance(turn_based.left(1000), SessionClose)
    assert isinstance(turn_based.left(1001), SessionClose)
    assert turn_based.left(1006) is None and turn_based.left(None) is None
    assert resumable.left(1000) is None
