"""Turn detection, items and the turn-based responder through the Realtime projection.

The projection and the session machine are composed here without I/O (what the
connection and session actors do, minus the sockets), and every wire event is
checked strictly against the openai SDK's own pydantic models.
"""

import base64
import json

import numpy as np
import pytest
from openai.resources.realtime.realtime import RealtimeConnection as GAConnection

from duplex import sessions as ds
from duplex.exceptions import ProtocolError
from duplex.wire._realtime import TURN_BASED_OPTIONS, RealtimeProjection, WireFormats

from .test_realtime import _Recorder, _update, check_wire

TONE = (0.3 * np.sin(np.arange(11520) * 2 * np.pi * 440 / 24000) * 32767).astype("<i2")  # 480 ms


def _frame(kind: str, **fields) -> str:
    return json.dumps({"type": kind, **fields})


class Session:
    """A projection and a machine wired as the actors wire them; collects the wire."""

    def __init__(self, *, schema: str = "ga", duplex: bool = False) -> None:
        self.proj = RealtimeProjection(schema=schema, duplex=duplex, model="loopback")
        config = ds.SessionConfig()
        if self.proj.initial_options is not None:
            config = config.updated(self.proj.initial_options)
        self.machine = ds.SessionMachine(config)
        self.schema, self.duplex = schema, duplex
        self.wire: list[dict] = []
        self.now = 0.0
        self._apply(ds.ConnectionAttached(1))

    def _apply(self, event) -> None:
        for effect in self.machine.handle(event, self.now):
            if isinstance(effect, ds.Send):
                for item in self.proj.encode(effect.event, effect.seq):
                    check_wire(item, schema=self.schema, duplex=self.duplex)
                    self.wire.append(item)

    def send(self, text: str) -> None:
        try:
            event = self.proj.parse(text)
        except ProtocolError as exc:
            event = None
            for item in self.proj.encode(ds.ErrorEvent.from_exception(exc), None):
                check_wire(item, schema=self.schema, duplex=self.duplex)
                self.wire.append(item)
        if event is not None:
            self._apply(event)

    def stream(self, pcm16: np.ndarray, chunk: int = 1920) -> None:
        for start in range(0, pcm16.size, chunk):
            audio = base64.b64encode(pcm16[start : start + chunk].tobytes()).decode()
            self.send(_frame("input_audio_buffer.append", audio=audio))
            self.now += chunk / 24000

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.02
            self._apply(ds.Tick())

    def types(self) -> list[str]:
        return [e["type"] for e in self.wire]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.wire if e["type"] == kind]


def test_turn_based_is_the_default_without_duplex():
    assert RealtimeProjection(duplex=True).initial_options is None
    assert RealtimeProjection().initial_options == TURN_BASED_OPTIONS
    config = ds.SessionConfig().updated(TURN_BASED_OPTIONS)
    assert (config.turn_policy, config.vad_hangover_ms, config.vad_prefix_padding_ms) == (
        "turn_based",
        500,
        300,
    )
    session = Session()
    (created,) = session.of("session.created")
    assert created["session"]["audio"]["input"]["turn_detection"] == {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
        "silence_duration_ms": 500, "create_response": True, "interrupt_response": True,
        "idle_timeout_ms": None,
    }  # fmt: skip
    beta = Session(schema="beta").of("session.created")[0]["session"]["turn_detection"]
    assert "idle_timeout_ms" not in beta and beta["create_response"] is True


@pytest.mark.parametrize("schema", ["ga", "beta"])
def test_vad_stop_commits_and_the_response_echoes_the_speech(schema):
    s = Session(schema=schema)
    s.stream(np.concatenate([TONE, np.zeros(16 * 1920, "<i2")]))
    s.run(1.0)
    kinds = s.types()
    started, stopped = (
        s.of("input_audio_buffer.speech_started"),
        s.of("input_audio_buffer.speech_stopped"),
    )
    (committed,) = s.of("input_audio_buffer.committed")
    assert started[0]["audio_start_ms"] == 0 and stopped[0]["audio_end_ms"] == 480
    assert started[0]["item_id"] == stopped[0]["item_id"] == committed["item_id"]
    delta = "response.output_audio.delta" if schema == "ga" else "response.audio.delta"
    audio = b"".join(base64.b64decode(e["delta"]) for e in s.of(delta))
    assert audio == TONE.tobytes()
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    (done,) = s.of("response.done")
    assert done["response"]["status"] == "completed"
    assert kinds[-1] == "rate_limits.updated"
    history = s.machine.history
    assert [i.role for i in history] == ["user", "assistant"]
    assert history[0].item_id == committed["item_id"]


def test_barge_in_cancels_with_turn_detected_then_truncate():
    s = Session()
    s.stream(np.concatenate([TONE, TONE, np.zeros(8 * 1920, "<i2")]))  # 960 ms of speech
    s.run(0.2)  # some of the response plays
    s.stream(TONE[:3840])  # the user talks over it
    (done,) = s.of("response.done")
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    item_id = done["response"]["output"][0]["id"]
    played = sum(len(base64.b64decode(e["delta"])) for e in s.of("response.output_audio.delta"))
    sent_ms = played // 48
    s.send(_frame("conversation.item.truncate", item_id=item_id, content_index=0,
                  audio_end_ms=sent_ms + 1, event_id="t1"))  # fmt: skip
    (err,) = s.of("error")
    assert (err["error"]["code"], err["error"]["event_id"]) == ("audio_end_ms_out_of_range", "t1")
    s.send(_frame("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=80))
    (truncated,) = s.of("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 80)
    assistant = next(i for i in s.machine.history if i.item_id == item_id)
    assert (assistant.audio_ms, assistant.text) == (80.0, "[0]")


def test_items_through_the_sdk():
    ws = _Recorder()
    conn = GAConnection(ws)
    conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        event_id="c1",
    )
    audio = base64.b64encode(TONE[:3840].tobytes()).decode()
    conn.conversation.item.create(
        item={"type": "message", "role": "user", "id": "u2",
              "content": [{"type": "input_audio", "audio": audio}]},
    )  # fmt: skip
    conn.conversation.item.retrieve(item_id="u2")
    conn.conversation.item.delete(item_id="u2")
    conn.conversation.item.retrieve(item_id="u2", event_id="r2")
    conn.response.create()
    s = Session()
    for frame in ws.sent:
        s.send(frame)
    s.run(0.1)
    added = s.of("conversation.item.added")
    assert [a["item"]["content"][0]["type"] for a in added[:2]] == ["input_text", "input_audio"]
    assert added[1]["previous_item_id"] == added[0]["item"]["id"]
    assert s.of("conversation.item.retrieved")[0]["item"]["id"] == "u2"
    assert s.of("conversation.item.deleted")[0]["item_id"] == "u2"
    (err,) = s.of("error")
    assert (err["error"]["code"], err["error"]["event_id"]) == ("item_not_found", "r2")
    transcript = s.of("response.output_audio_transcript.done")[0]["transcript"]
    assert transcript == "hi"  # the newest user item left is the text one
    assert s.machine.history[-1].text == "hi"


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ({"type": "function_call", "role": "user", "content": []}, "bad_event", "item.role"),
        ({"type": "message", "role": "robot", "content": []}, "bad_event", "item.role"),
        ({"type": "message", "role": "user", "content": []}, "unsupported_parameter",
         "item.content"),
        ({"type": "message", "role": "assistant",
          "content": [{"type": "output_audio", "audio": "AAAA"}]}, "unsupported_parameter",
         "item.content.0.type"),
        ({"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "*"}]},
         "bad_audio", "item.content.0.audio"),
        ({"type": "message", "role": "user", "content": [{"type": "input_text", "text": 3}]},
         "bad_event", "item.content.0.text"),
        ({"type": "message", "role": "user", "extra": 1, "content": []}, "bad_event",
         "item.extra"),
        # tool items: their own fields, each checked
        ({"type": "function_call_output", "output": "{}"}, "bad_event", "item.call_id"),
        ({"type": "function_call_output", "call_id": "c1", "output": 3}, "bad_event",
         "item.output"),
        ({"type": "function_call_output", "call_id": "c1", "output": "{}", "role": "tool"},
         "bad_event", "item.role"),
        ({"type": "function_call", "call_id": "c1", "arguments": "{}"}, "bad_event",
         "item.name"),
        ({"type": "mcp_call", "id": "x"}, "unsupported_parameter", "item.type"),
        # content fields the part type does not use are refused, never dropped
        ({"type": "message", "role": "user",
          "content": [{"type": "input_audio", "audio": "AAAA", "transcript": "hi"}]},
         "unsupported_parameter", "item.content.0.transcript"),
        ({"type": "message", "role": "user",
          "content": [{"type": "input_text", "text": "hi", "audio": "AAAA"}]},
         "bad_event", "item.content.0.audio"),
        ({"type": "message", "role": "user",
          "content": [{"type": "input_audio", "audio": "AAAA", "text": "hi"}]},
         "bad_event", "item.content.0.text"),
        ({"type": "message", "role": "assistant",
          "content": [{"type": "output_text", "text": "hi", "transcript": "hi"}]},
         "bad_event", "item.content.0.transcript"),
    ],
)  # fmt: skip
def test_item_create_refusals(item, code, param):
    with pytest.raises(ProtocolError) as info:
        RealtimeProjection().parse(_frame("conversation.item.create", item=item))
    assert (info.value.code, info.value.param) == (code, param)


def test_turn_detection_spellings_and_rules():
    proj = RealtimeProjection()
    ga = {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 700, "create_response": False,
        "idle_timeout_ms": 3000}}}}  # fmt: skip
    options = proj.parse(_frame("session.update", session=ga)).options
    assert (options.turn_detection, options.vad_hangover_ms, options.vad_threshold) == (
        "server_vad",
        700,
        0.5,
    )
    assert (options.vad_create_response, options.vad_idle_timeout_ms) == (False, 3000)
    beta = RealtimeProjection(schema="beta")
    off = beta.parse(_frame("session.update", session={"turn_detection": None})).options
    assert off.turn_detection == "none"
    refused = {"turn_detection": {"type": "server_vad", "interrupt_response": False}}
    assert _update(refused, duplex=True) == (
        "unsupported_turn_detection",
        "session.turn_detection.interrupt_response",
    )
    assert isinstance(proj.parse(_frame("session.update", session=refused)), ds.SessionUpdate)


def test_turn_detection_off_means_manual_turns():
    s = Session()
    off = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    s.send(_frame("session.update", session=off))
    assert s.of("session.updated")[0]["session"]["audio"]["input"]["turn_detection"] is None
    s.stream(np.concatenate([TONE, np.zeros(16 * 1920, "<i2")]))
    assert "input_audio_buffer.speech_started" not in s.types()
    s.send(_frame("input_audio_buffer.commit"))
    s.send(_frame("response.create"))
    s.run(2.0)  # 1.6 s of audio plays in real time
    assert s.types().count("response.done") == 1
    audio = b"".join(base64.b64decode(e["delta"]) for e in s.of("response.output_audio.delta"))
    assert audio == np.concatenate([TONE, np.zeros(16 * 1920, "<i2")]).tobytes()


def test_idle_timeout_is_announced_then_answered():
    s = Session()
    s.send(_frame("session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "idle_timeout_ms": 1000}}}}))  # fmt: skip
    s.stream(np.zeros(14 * 1920, "<i2"))  # 1120 ms of silence
    (timeout,) = s.of("input_audio_buffer.timeout_triggered")
    assert (timeout["audio_start_ms"], timeout["audio_end_ms"]) == (0, 1040)
    kinds = s.types()
    assert kinds.index("input_audio_buffer.timeout_triggered") < kinds.index(
        "input_audio_buffer.committed"
    ) < kinds.index("response.created")  # fmt: skip


# ------------------------------------------------- formats are session state


def _ulaw_frame() -> tuple[str, np.ndarray]:
    from duplex.codecs._g711 import ulaw_decode, ulaw_encode
    from duplex.pcm import pcm16_to_float

    ulaw = ulaw_encode(TONE[:800:3].astype(np.int16))
    audio = base64.b64encode(ulaw).decode()
    return _frame("input_audio_buffer.append", audio=audio), pcm16_to_float(ulaw_decode(ulaw))


def test_a_resumed_socket_keeps_the_negotiated_formats():
    s = Session(duplex=True)
    formats = {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw"}
    s.send(_frame("session.update", session=formats))
    (updated,) = s.of("session.updated")
    assert s.machine.config.input_audio_codec == s.machine.config.output_audio_codec == "g711_ulaw"
    (created,) = s.of("session.created")
    s.machine.handle(ds.ConnectionDetached(1), s.now)
    for cursor in (updated["server_event_seq"], 0):  # 0: session.updated is replayed too
        proj = RealtimeProjection(duplex=True, model="loopback")  # a new socket's projection
        resume = proj.parse(_frame(
            "session.resume", session_id=created["session"]["id"],
            resume_token=created["resume_token"], last_received_server_event_seq=cursor,
        ))  # fmt: skip
        wire = []
        generation = 2 + cursor
        for effect in s.machine.handle(ds.ConnectionAttached(generation, resume), s.now):
            if isinstance(effect, ds.Send) and effect.generation == generation:
                wire += proj.encode(effect.event, effect.seq)
        assert wire[0]["type"] == "session.resumed"
        created["resume_token"] = wire[0]["resume_token"]
        assert proj.formats == WireFormats("g711_ulaw", "g711_ulaw")
        frame, pcm = _ulaw_frame()
        append = proj.parse(frame)
        assert append.sample_rate == 8000 and append.pcm.tolist() == pcm.tolist()
        (delta,) = proj.encode(ds.AudioDelta("r", "i", 0, TONE[:480].tobytes(), 24000, 0.0), 99)
        assert (delta["format"], delta["sample_rate_hz"]) == ("g711_ulaw", 8000)


def test_a_refused_update_switches_nothing_and_names_the_wire_field():
    s = Session(duplex=True)
    session = {"input_audio_format": "g711_ulaw", "overlap_barge_in_ms": 500}  # <= short ack
    s.send(_frame("session.update", event_id="u1", session=session))
    (err,) = s.of("error")
    error = err["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "bad_event", "session.overlap_barge_in_ms", "u1",
    )  # fmt: skip
    assert s.proj.formats == WireFormats()
    assert s.machine.config.input_audio_codec == "pcm16"
    append = s.proj.parse(_frame("input_audio_buffer.append", audio="AAA="))
    assert append.sample_rate == 24000 and append.pcm.size == 1  # still PCM16


def test_an_update_of_the_input_format_waits_for_the_sessions_answer():
    """A ``session.update`` naming another input format pauses the projection until the
    session answers it; the answer, not the projection, decides how the next append decodes
    (accepted: μ-law at once; refused: still PCM16). Output follows ``session.updated``."""
    proj = RealtimeProjection(duplex=True)
    machine = ds.SessionMachine()

    def run(event) -> list[dict]:
        wire = []
        for effect in machine.handle(event, 0.0):
            if isinstance(effect, ds.Send):
                wire += proj.encode(effect.event, effect.seq)
        return wire

    run(ds.ConnectionAttached(1))
    refused = {"input_audio_format": "g711_alaw", "overlap_short_ack_ms": 5000}
    update = proj.parse(_frame("session.update", session=refused))
    assert proj.paused
    # an error that answers something else (an engine failure) does not unpause it
    proj.encode(ds.ErrorEvent.from_exception(ProtocolError("engine restarted")), None)
    assert proj.paused
    (error,) = run(update)
    assert error["type"] == "error" and not proj.paused
    assert proj.formats == WireFormats()
    assert proj.parse(_frame("input_audio_buffer.append", audio="AAA=")).sample_rate == 24000

    both = {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"}
    update = proj.parse(_frame("session.update", session=both))
    assert proj.paused
    delta = ds.AudioDelta("r", "i", 0, TONE[:480].tobytes(), 24000, 0.0)
    assert proj.encode(delta, 5)[0]["format"] == "pcm16"  # sent before the session switched
    assert proj.paused
    (updated,) = run(update)
    assert updated["type"] == "session.updated" and not proj.paused
    frame, pcm = _ulaw_frame()
    append = proj.parse(frame)
    assert append.sample_rate == 8000 and append.pcm.tolist() == pcm.tolist()
    assert proj.encode(delta, 7)[0]["format"] == "g711_alaw"
    assert proj.formats == WireFormats("g711_ulaw", "g711_alaw")


def test_an_update_that_keeps_the_input_format_does_not_pause():
    proj = RealtimeProjection(duplex=True)
    for session in ({"output_audio_format": "g711_ulaw"}, {"input_audio_format": "pcm16"}):
        proj.parse(_frame("session.update", session=session))
        assert not proj.paused
    # answers in order: the two updates above, then one that pauses
    update = proj.parse(_frame("session.update", session={"input_audio_format": "g711_ulaw"}))
    config = ds.SessionConfig()
    for n in range(2):
        proj.encode(ds.SessionUpdated("duplex-abc", config), n + 1)
        assert proj.paused
    proj.encode(ds.SessionUpdated("duplex-abc", config.apply_update(update.options)), 3)
    assert not proj.paused and proj.formats.input == "g711_ulaw"


def test_a_replayed_answer_does_not_unpause():
    """After ``session.resumed``, the journal's replay answers the previous socket's
    updates, not this one's."""
    proj = RealtimeProjection(duplex=True)
    config = ds.SessionConfig()
    proj.encode(ds.SessionResumed("duplex-abc", "tok", 2, 0, 1, 4, config), None)
    update = proj.parse(_frame("session.update", session={"input_audio_format": "g711_ulaw"}))
    proj.encode(ds.SessionUpdated("duplex-abc", config), 4)  # replayed
    err = ds.ErrorEvent.from_exception(ProtocolError("x"), update_refused=True)
    proj.encode(err, 3)  # replayed
    assert proj.paused and proj.formats.input == "pcm16"
    proj.encode(ds.SessionUpdated("duplex-abc", config.apply_update(update.options)), 5)
    assert not proj.paused and proj.formats.input == "g711_ulaw"
