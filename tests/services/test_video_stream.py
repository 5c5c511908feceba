"""The ``/v1/realtime/video`` machine, without a socket: events in, effects out."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duplex.services.media._protocol import MediaLimits
from duplex.services.media._video_stream import (
    MAX_CONTROL_BYTES,
    Close,
    Phase,
    RealtimeVideo,
    SendBinary,
    SendText,
    StartGeneration,
    StopGeneration,
)


def machine(now: float = 0.0) -> RealtimeVideo:
    return RealtimeVideo(
        model="m",
        request_id="video_stream-1",
        limits=MediaLimits(),
        now=now,
        start_timeout_s=10.0,
        stall_timeout_s=60.0,
    )


def texts(effects: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(e.text) for e in effects if isinstance(e, SendText)]


START = json.dumps({"type": "session.start", "prompt": "waves", "width": 32, "height": 16})


def started(now: float = 0.0) -> RealtimeVideo:
    video = machine(now)
    effects = video.receive_text(START, now)
    assert texts(effects)[0]["type"] == "video.start"
    assert isinstance(effects[1], StartGeneration)
    return video


def test_start_then_chunks_then_trailer_then_done() -> None:
    video = machine()
    effects = video.receive_text(START, 1.0)
    (event,) = texts(effects)
    assert event["format"] == "m4s" and event["config"]["width"] == 32
    assert effects[1] == StartGeneration(effects[1].start)
    chunk = video.chunk(b"abc", 3, 2.0)
    assert isinstance(chunk[1], SendBinary) and chunk[1].data == b"abc"
    (meta,) = texts(chunk)
    assert (meta["kind"], meta["num_frames"], meta["byte_length"]) == ("media", 3, 3)
    assert (meta["generation_chunk_index"], meta["transport_chunk_index"]) == (0, 0)
    end = video.finished(b"z", 1, 3.0)
    trailer, done = texts(end)
    assert trailer["kind"] == "trailer" and trailer["generation_chunk_index"] is None
    assert trailer["transport_chunk_index"] == 1
    assert done == {
        "type": "session.done",
        "request_id": "video_stream-1",
        "chunks": 2,
        "stopped": False,
    }
    assert end[-1] == Close(1000, "done")
    assert video.phase is Phase.FINISHED and video.deadline is None
    assert video.frames_sent == 4


def test_start_timeout_and_its_refresh() -> None:
    video = machine(5.0)
    assert video.deadline == 15.0
    assert video.tick(14.9) == []
    effects = video.tick(15.0)
    assert texts(effects)[0]["code"] == "start_timeout"
    assert effects[-1] == Close(1008, "start_timeout")


def test_stall_timeout_refreshed_by_progress_and_ping() -> None:
    video = started(0.0)
    assert video.deadline == 60.0
    video.progress(30.0)
    assert video.deadline == 90.0
    assert texts(video.receive_text('{"type":"session.ping"}', 80.0))[0]["type"] == "session.pong"
    assert video.deadline == 140.0
    assert video.tick(139.0) == []
    effects = video.tick(140.0)
    assert effects[0] == StopGeneration()
    assert texts(effects)[0]["message"] == "Stall timeout: no generation progress"
    assert effects[-1] == Close(1011, "stall_timeout")


def test_stop_before_and_during_generation() -> None:
    early = machine().receive_text('{"type":"session.stop"}', 1.0)
    assert texts(early)[0] == {
        "type": "session.done",
        "request_id": "video_stream-1",
        "chunks": 0,
        "stopped": True,
    }
    video = started()
    video.chunk(b"x", 1, 1.0)
    effects = video.receive_text('{"type":"session.stop"}', 2.0)
    assert effects[0] == StopGeneration()
    assert texts(effects)[0]["chunks"] == 1 and effects[-1] == Close(1000, "stopped")
    assert video.chunk(b"late", 1, 3.0) == []  # a chunk that was on its way is dropped


def test_bad_frames_before_the_start_end_the_socket_after_it_do_not() -> None:
    for frame in ("{", "[]", '{"type":"nope"}', '{"type":"session.start","prompt":""}'):
        effects = machine().receive_text(frame, 0.0)
        assert texts(effects)[0]["type"] == "error"
        assert isinstance(effects[-1], Close) and effects[-1].code == 1008
    assert isinstance(machine().receive_binary(b"\x00", 0.0)[-1], Close)
    video = started()
    for frame in ("{", '{"type":"nope"}', START, '{"type":"session.interaction"}'):
        (effect,) = video.receive_text(frame, 1.0)
        assert json.loads(effect.text)["type"] == "error"  # type: ignore[union-attr]
    (effect,) = video.receive_binary(b"\x00", 1.0)
    assert json.loads(effect.text)["code"] == "binary_frame_unsupported"  # type: ignore[union-attr]
    (effect,) = video.receive_text(" " * (MAX_CONTROL_BYTES + 1), 1.0)
    assert json.loads(effect.text)["code"] == "event_too_large"  # type: ignore[union-attr]
    assert video.phase is Phase.STREAMING


def test_failure_sends_a_generic_error_and_closes() -> None:
    video = started()
    effects = video.failed("The generation failed.", 1.0)
    assert texts(effects)[0]["code"] == "generation_failed"
    assert effects[-1] == Close(1011, "failed")


FRAMES = st.sampled_from(
    [START, '{"type":"session.ping"}', '{"type":"session.stop"}', "{", '{"type":"x"}']
)


@given(
    st.lists(
        st.one_of(
            FRAMES.map(lambda f: ("text", f)),
            st.just(("chunk", "")),
            st.just(("progress", "")),
            st.just(("tick", "")),
            st.just(("finished", "")),
        ),
        max_size=30,
    )
)
def test_any_sequence_ends_at_most_once_and_never_sends_after_the_end(
    steps: list[tuple[str, str]],
) -> None:
    video = machine()
    now = 0.0
    closes = 0
    for kind, frame in steps:
        now += 7.0
        before = video.phase
        if kind == "text":
            effects = video.receive_text(frame, now)
        elif kind == "chunk":
            effects = video.chunk(b"c", 1, now)
        elif kind == "progress":
            video.progress(now)
            effects = []
        elif kind == "tick":
            effects = video.tick(now)
        else:
            effects = video.finished(b"t", 1, now)
        if before is Phase.FINISHED:
            assert effects == []
        closes += sum(isinstance(e, Close) for e in effects)
        if any(isinstance(e, Close) for e in effects):
            assert isinstance(effects[-1], Close) and video.phase is Phase.FINISHED
        for index, effect in enumerate(effects):  # each binary frame right after its metadata
            if isinstance(effect, SendBinary):
                assert json.loads(effects[index - 1].text)["type"] == "video.chunk_metadata"
    assert closes <= 1
