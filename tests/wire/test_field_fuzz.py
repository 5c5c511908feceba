"""Hostile values in every field of every client event, on both protocols.

For each client event type the parsers know (``CLIENT_EVENT_NAMES``,
``REALTIME_CLIENT_EVENTS`` + ``DUPLEX_CLIENT_EVENTS``), a valid example sets every
field it may carry; a mutation replaces one field, at any depth, with a hostile JSON
literal (bignums, ``NaN``/``Infinity``/``1e999``, negatives, wrong types, a 100 kB
string), written into the JSON text so Python's parser builds the value.

Every single change is tried (`test_every_field_with_every_hostile_value`); hypothesis
draws combinations of up to three. The property: parsing raises nothing but a
`ProtocolError` that names a ``param``, whose ``error`` event encodes; an event that
parses is taken by a real session machine (mock time) that is mid-response, then
speech pauses the response and time runs through the false-interruption timeout, the
turn and the session's expiry, with every server event encoded by the same
projection. Nothing raises.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex import sessions as ds
from duplex.exceptions import ConfigError, ProtocolError
from duplex.wire._native import _SESSION_FIELDS, CLIENT_EVENT_NAMES, NativeProjection
from duplex.wire._realtime import (
    DUPLEX_CLIENT_EVENTS,
    REALTIME_CLIENT_EVENTS,
    RealtimeProjection,
)

from ..sessions.sessionkit import counter_random

BIG = "1" + "0" * 309  # overflows a float
HOSTILE: tuple[str, ...] = (
    BIG,
    "-" + BIG,
    str(2**63),
    str(-(2**63)),
    str(2**53 - 1),  # the largest accepted count
    str(2**53 + 1),
    "86400",  # a day, the longest accepted duration in seconds
    "86400000",  # and in ms
    "86400001",
    "-1",
    "-0.5",
    "0",
    "0.0",
    "1.5",
    "1e308",
    "-1e308",
    "5e-324",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "{}",
    '{"a": 1}',
    "[]",
    "[{}]",
    "true",
    "false",
    "null",
    '""',
    json.dumps("x" * 100_000),
)
"""JSON literals, as a client could send them (Python's json accepts NaN and Infinity)."""

RATE = 24_000
_LOUD = (0.3 * np.sin(np.arange(1920) * 0.2) * 32767).astype("<i2")
AUDIO = base64.b64encode(_LOUD.tobytes()).decode()  # 80 ms of PCM16 at 24 kHz
RGB = base64.b64encode(bytes(12)).decode()  # a 2x2 raw frame

Ids = dict[str, str]


def _duplex_events(ids: Ids) -> list[tuple[str, dict[str, Any]]]:
    """The native events (also ``/v1/realtime?duplex=1``'s extensions), every field set."""
    session = {
        "overlap_policy": "barge_in_on_speech",
        "overlap_short_ack_ms": 700,
        "short_ack_ms": 700,
        "overlap_barge_in_ms": 1000,
        "barge_in_ms": 1000,
        "false_interruption_enabled": True,
        "false_interruption_timeout_s": 2.0,
        "playback_commit_policy": "ack_only",
        "input_sample_rate": 24_000,
        "prompt": {"text": "be brief", "voice": "a"},
    }
    assert set(session) == set(_SESSION_FIELDS)  # a new session field needs a value here
    return [
        ("session.create", {"session": session}),
        ("session.update", {"session": {k: v for k, v in session.items() if k != "prompt"}}),
        (
            "input_audio_buffer.append",
            {"audio": AUDIO, "format": "pcm16", "sample_rate": 24_000, "sample_rate_hz": 24_000},
        ),
        ("input_audio_buffer.commit", {}),
        ("input_audio_buffer.clear", {}),
        ("turn.signal", {"event": "barge_in", "payload": {"source": "client"}}),
        (
            "playback.ack",
            {"response_id": ids["response"], "item_id": ids["item"], "played_ms": 80},
        ),
        ("response.create", {}),
        ("response.cancel", {"response_id": ids["response"]}),
        (
            "session.resume",
            {
                "session_id": ids["session"],
                "resume_token": "token",
                "last_received_server_event_seq": 1,
            },
        ),
        ("session.event_ack", {"server_event_seq": 1}),
        ("session.close", {}),
        (
            "input_video.append",
            {
                "frame": RGB,
                "frame_id": "f1",
                "pts_ms": 40,
                "format": "rgb",
                "width": 2,
                "height": 2,
            },
        ),
    ]


def _realtime_events(ids: Ids) -> list[tuple[str, dict[str, Any]]]:
    """The Realtime events, in both spellings where they differ, every field set."""
    vad = {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "create_response": True,
        "interrupt_response": True,
        "idle_timeout_ms": 5000,
    }
    ga_session = {
        "type": "realtime",
        "model": "loopback",
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24_000},
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": vad,
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24_000}, "speed": 1.0},
        },
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
    }
    beta_session = {
        "modalities": ["audio", "text"],
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "turn_detection": dict(vad),
        "input_audio_transcription": None,
        "max_response_output_tokens": "inf",
    }
    user_audio = {"type": "input_audio", "audio": AUDIO}
    return [
        ("session.update", {"session": ga_session}),
        ("session.update", {"session": beta_session}),
        ("input_audio_buffer.append", {"audio": AUDIO}),
        ("input_audio_buffer.commit", {}),
        ("input_audio_buffer.clear", {}),
        ("output_audio_buffer.clear", {}),
        (
            "conversation.item.create",
            {
                "previous_item_id": ids["item"],
                "item": {
                    "id": "item_user",
                    "type": "message",
                    "object": "realtime.item",
                    "status": "completed",
                    "role": "user",
                    "content": [user_audio],
                },
            },
        ),
        (
            "conversation.item.create",
            {
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                }
            },
        ),
        ("conversation.item.retrieve", {"item_id": ids["item"]}),
        ("conversation.item.delete", {"item_id": ids["item"]}),
        (
            "conversation.item.truncate",
            {"item_id": ids["item"], "content_index": 0, "audio_end_ms": 40},
        ),
        ("response.create", {"response": {"output_modalities": ["audio"]}}),
        ("response.cancel", {"response_id": ids["response"]}),
    ]


# ----------------------------------------------------------------- the sessions


Codec = NativeProjection | RealtimeProjection


@dataclass
class Harness:
    """A codec and a session machine that is mid-response, wired as the actors wire them."""

    codec: Codec
    machine: ds.SessionMachine
    now: float = 0.0
    response: ds.ResponseCreated | None = None

    def apply(self, event: ds.Event) -> list[ds.Effect]:
        effects = self.machine.handle(event, self.now)
        for effect in effects:
            if isinstance(effect, ds.Send):
                self.codec.frames(effect.event, effect.seq)
                if isinstance(effect.event, ds.ResponseCreated):
                    self.response = effect.event
        return effects

    def audio(self, ms: int, *, loud: bool) -> None:
        n = RATE * ms // 1000
        pcm = 0.3 * np.sin(np.arange(n) * 0.2) if loud else np.zeros(n)
        for start in range(0, n, 1920):
            self.apply(ds.AudioAppend(pcm[start : start + 1920].astype(np.float32)))
            self.now += 0.08

    def model(self, frames: int) -> None:
        for _ in range(frames):
            pcm = np.full(1920, 0.1, dtype=np.float32)
            self.apply(ds.ModelFrame(self.machine.epoch, pcm, "a", True, False))
            self.apply(ds.Tick())
            self.now += 0.08

    def pause_and_run_out(self) -> None:
        """Speech over the response (a pause), silence, then every timer in turn."""
        self.model(2)
        self.audio(400, loud=True)
        self.model(2)
        self.audio(800, loud=False)
        for n in range(40):  # the resume, the response's end, journal expiries, idle expiry
            deadline = self.machine.next_deadline()
            if deadline is None:
                break
            self.now = max(self.now, deadline)
            self.apply(ds.Tick())
            if n < 2:
                self.model(1)


def _harness(codec: Codec, options: ds.SessionOptions | None = None) -> Harness:
    """A session that heard a turn and is answering it (duplex: the model; turn-based:
    the turn responder)."""
    config = ds.SessionConfig(max_tracked_responses=4)
    if codec.initial_options is not None:
        config = config.updated(codec.initial_options)
    if options is not None:
        config = config.updated(options)
    harness = Harness(codec, ds.SessionMachine(config, random_bytes=counter_random()))
    harness.apply(ds.ConnectionAttached(1))
    harness.audio(400, loud=True)
    harness.audio(800, loud=False)
    if config.turn_policy != "turn_based":  # turn-based: the VAD's stop asked for one
        harness.model(3)
    return harness


def _ids(codec: Callable[[], Codec]) -> Ids:
    """The ids of the prelude's session and response (the same in every harness)."""
    harness = _harness(codec())
    response = harness.response
    assert response is not None
    return {
        "session": harness.machine.session_id,
        "response": response.response_id,
        "item": response.item_id,
    }


@dataclass(frozen=True)
class Protocol:
    """One endpoint: how to make its codec, and its client events with example bodies."""

    name: str
    codec: Callable[[], Codec]
    names: tuple[str, ...]
    examples: Callable[[Ids], list[tuple[str, dict[str, Any]]]]

    def cases(self) -> list[dict[str, Any]]:
        events = self.examples(_ids(self.codec))
        covered = {kind for kind, _ in events}
        assert covered == set(self.names), set(self.names) ^ covered
        return [{"type": kind, "event_id": "evt_1", **body} for kind, body in events]


PROTOCOLS = (
    Protocol("duplex", NativeProjection, CLIENT_EVENT_NAMES, _duplex_events),
    Protocol(
        "realtime",
        lambda: RealtimeProjection(model="loopback"),
        REALTIME_CLIENT_EVENTS,
        _realtime_events,
    ),
    Protocol(
        "realtime?duplex=1",
        lambda: RealtimeProjection(duplex=True, model="loopback"),
        REALTIME_CLIENT_EVENTS + DUPLEX_CLIENT_EVENTS,
        lambda ids: (
            _realtime_events(ids)
            + [event for event in _duplex_events(ids) if event[0] in DUPLEX_CLIENT_EVENTS]
        ),
    ),
    Protocol(
        "realtime beta",
        lambda: RealtimeProjection(schema="beta", model="loopback"),
        REALTIME_CLIENT_EVENTS,
        _realtime_events,
    ),
)
CASES = {p.name: p.cases() for p in PROTOCOLS}


# ------------------------------------------------------------------ mutations


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field and list element, at any depth (parents before children)."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        yield (*prefix, key)
        if isinstance(child, dict | list) and child:
            yield from _paths(child, (*prefix, key))


def _mutated(example: dict[str, Any], changes: list[tuple[tuple[Any, ...], str]]) -> str:
    """The JSON text of ``example`` with each path's value replaced by a JSON literal."""
    event = copy.deepcopy(example)
    literals = {}
    for n, (path, literal) in enumerate(changes):
        target = event
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = f"@@hostile{n}@@"
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced a parent
        literals[f'"@@hostile{n}@@"'] = literal
    text = json.dumps(event)
    for sentinel, literal in literals.items():
        text = text.replace(sentinel, literal)
    return text


def _check(protocol: Protocol, text: str) -> Harness | None:
    """The property, for one message; the session it ran, if the message parsed.

    The message arrives as it would: on a live session whose codec has seen its
    ``session.created`` (whose config a Realtime projection decodes appends in).
    A ``session.create`` opens a session with its options instead, as the hub does.
    """
    harness = _harness(protocol.codec())
    try:
        event = harness.codec.parse(text)
    except ProtocolError as exc:
        assert exc.param, (type(exc).__name__, exc.message[:200])
        harness.codec.frames(ds.ErrorEvent.from_exception(exc), None)
        return None
    if isinstance(event, ds.SessionCreate):
        try:
            harness = _harness(protocol.codec(), event.options)
        except ConfigError:  # the hub refuses it (bad_event)
            return None
    else:
        harness.apply(event)
    harness.pause_and_run_out()
    return harness


@st.composite
def _messages(draw: st.DrawFn) -> tuple[Protocol, str]:
    protocol = draw(st.sampled_from(PROTOCOLS))
    example = draw(st.sampled_from(CASES[protocol.name]))
    paths = list(_paths(example))
    count = draw(st.integers(1, 3))
    changes = [(draw(st.sampled_from(paths)), draw(st.sampled_from(HOSTILE))) for _ in range(count)]
    return protocol, _mutated(example, changes)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_messages())
def test_hostile_values_are_refused_or_harmless(message: tuple[Protocol, str]) -> None:
    protocol, text = message
    _check(protocol, text)


def test_every_field_with_every_hostile_value() -> None:
    """Exhaustive over single changes: each is refused naming its param, or the event it
    parses to survives the session drive (each distinct event once: most accepted changes
    are the same event, such as an ``event_id`` of 100 kB)."""
    driven: set[tuple[str, str]] = set()
    for protocol in PROTOCOLS:
        for example in CASES[protocol.name]:
            for path in _paths(example):
                for literal in HOSTILE:
                    text = _mutated(example, [(path, literal)])
                    try:
                        event = protocol.codec().parse(text)
                    except ProtocolError as exc:
                        assert exc.param, (protocol.name, path, literal[:40], exc.message[:200])
                        continue
                    key = (protocol.name, repr(replace(event, event_id=None)))
                    if key not in driven:
                        driven.add(key)
                        _check(protocol, text)
    assert len(driven) > 100  # the drive ran on many accepted variants, not a few


def test_the_examples_are_accepted_and_the_drive_pauses_and_expires() -> None:
    """The property is only as good as its examples and its drive: each example parses,
    and the drive pauses a duplex response, resumes it and runs the session out."""
    for protocol in PROTOCOLS:
        for example in CASES[protocol.name]:
            harness = _check(protocol, json.dumps(example))
            assert harness is not None, example
            assert harness.machine.state is ds.SessionState.CLOSED, example["type"]
            if harness.machine.config.turn_policy == "duplex" and example["type"] not in (
                "session.close",
                "session.update",  # its overlap_policy, ack_only: may end the response first
            ):
                stats = harness.machine.statistics()
                assert (stats.pauses, stats.resumes) >= (1, 1), example["type"]
