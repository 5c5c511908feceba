"""``WS /v1/realtime/video``: the protocol of one streaming-video socket, sans-I/O.

::

    awaiting_start ──session.start──> streaming ──last chunk──> finished
         │  (start timeout, bad start)     │ (session.stop, stall timeout, failure)
         ╰─────────────────────────────────┴─────────────────> finished

The machine takes what happened (a text or binary frame, a generation step, an
encoded chunk, the end or failure of the generation, the clock) with ``now``, and
returns effects for the socket's adapter to perform in order: frames to send,
generation to start or stop, the close. It reads no clock: `deadline` says when
``tick`` is due. Each chunk is a ``video.chunk_metadata`` text frame immediately
followed by its binary fragmented-MP4 frame (two effects, sent together).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from duplex.exceptions import ProtocolError

from ._protocol import MediaLimits, RealtimeVideoStart, parse_realtime_video_start

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_START_BYTES",
    "Close",
    "Phase",
    "RealtimeVideo",
    "SendBinary",
    "SendText",
    "StartGeneration",
    "StopGeneration",
]

MAX_START_BYTES: Final = 4 * 1024 * 1024
"""Largest ``session.start`` text frame."""
MAX_CONTROL_BYTES: Final = 128 * 1024
"""Largest text frame once streaming (ping, stop)."""


class Phase(enum.Enum):
    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    FINISHED = "finished"


@final
@dataclass(frozen=True, slots=True)
class SendText:
    text: str


@final
@dataclass(frozen=True, slots=True)
class SendBinary:
    data: bytes


@final
@dataclass(frozen=True, slots=True)
class StartGeneration:
    start: RealtimeVideoStart


@final
@dataclass(frozen=True, slots=True)
class StopGeneration:
    pass


@final
@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


Effect = SendText | SendBinary | StartGeneration | StopGeneration | Close


def _text(payload: Mapping[str, Any]) -> SendText:
    return SendText(json.dumps(payload, separators=(",", ":"), allow_nan=False))


@final
class RealtimeVideo:
    """One socket's protocol state: phase, chunk counters, the start and stall clocks."""

    def __init__(
        self,
        *,
        model: str,
        request_id: str,
        limits: MediaLimits,
        now: float,
        start_timeout_s: float = 10.0,
        stall_timeout_s: float = 60.0,
    ) -> None:
        self.model = model
        self.request_id = request_id
        self.limits = limits
        self.start_timeout_s = start_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.phase = Phase.AWAITING_START
        self.opened_at = now
        self.last_progress = now
        self.chunks = 0
        self.media_chunks = 0
        self.frames_sent = 0

    @property
    def deadline(self) -> float | None:
        """When ``tick`` must next be called (``None``: finished)."""
        if self.phase is Phase.AWAITING_START:
            return self.opened_at + self.start_timeout_s
        if self.phase is Phase.STREAMING:
            return self.last_progress + self.stall_timeout_s
        return None

    def _error(self, message: str, code: str) -> SendText:
        return _text(
            {"type": "error", "message": message, "code": code, "request_id": self.request_id}
        )

    def _finish(self, *effects: Effect) -> list[Effect]:
        self.phase = Phase.FINISHED
        return list(effects)

    def _done(self, stopped: bool) -> SendText:
        return _text(
            {
                "type": "session.done",
                "request_id": self.request_id,
                "chunks": self.chunks,
                "stopped": stopped,
            }
        )

    def receive_text(self, text: str, now: float) -> list[Effect]:
        """A client text frame."""
        if self.phase is Phase.FINISHED:
            return []
        limit = MAX_START_BYTES if self.phase is Phase.AWAITING_START else MAX_CONTROL_BYTES
        if len(text) > limit:  # characters: at most the bytes it took
            return self._refuse(f"The frame is larger than {limit} bytes.", "event_too_large")
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):
            return self._refuse("The frame is not valid JSON.", "invalid_json")
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return self._refuse("An event is a JSON object with a string 'type'.", "bad_event")
        kind = event["type"]
        if kind == "session.ping":
            if self.phase is Phase.STREAMING:
                self.last_progress = now
            return [_text({"type": "session.pong", "request_id": self.request_id})]
        if kind == "session.stop":
            if self.phase is Phase.STREAMING:
                return self._finish(StopGeneration(), self._done(True), Close(1000, "stopped"))
            return self._finish(self._done(True), Close(1000, "stopped"))
        if kind == "session.start":
            if self.phase is not Phase.AWAITING_START:
                return [self._error("The session has already started.", "illegal_state")]
            try:
                start = parse_realtime_video_start(event, self.model, self.limits)
            except ProtocolError as exc:
                return self._finish(
                    self._error(exc.message, exc.code), Close(1008, "invalid_session_start")
                )
            self.phase = Phase.STREAMING
            self.last_progress = now
            started = {
                "type": "video.start",
                "request_id": self.request_id,
                "format": "m4s",
                "config": start.config(),
            }
            return [_text(started), StartGeneration(start)]
        if kind == "session.interaction":
            return [self._error("This pipeline takes no interactions.", "interaction_failed")]
        return self._refuse(f"Unknown event type {kind[:100]!r}.", "unknown_event")

    def _refuse(self, message: str, code: str) -> list[Effect]:
        """A bad frame: an error event; before the start it also ends the socket."""
        if self.phase is Phase.AWAITING_START:
            return self._finish(self._error(message, code), Close(1008, code))
        return [self._error(message, code)]

    def receive_binary(self, data: bytes, now: float) -> list[Effect]:
        """A client binary frame: this protocol has none."""
        if self.phase is Phase.FINISHED:
            return []
        return self._refuse("Binary frames are not accepted.", "binary_frame_unsupported")

    def progress(self, now: float) -> None:
        """A generation step finished: the stall clock starts again."""
        if self.phase is Phase.STREAMING:
            self.last_progress = now

    def _chunk(self, data: bytes, frames: int, kind: str, index: int | None) -> list[Effect]:
        metadata = {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": kind,
            "num_frames": frames,
            "byte_length": len(data),
            "generation_chunk_index": index,
            "transport_chunk_index": self.chunks,
            "started_event_ids": [],
            "active_event_ids": [],
            "completed_event_ids": [],
        }
        self.chunks += 1
        self.frames_sent += frames
        return [_text(metadata), SendBinary(data)]

    def chunk(self, data: bytes, frames: int, now: float) -> list[Effect]:
        """A generated chunk, encoded: ``frames`` frames are complete in ``data``."""
        if self.phase is not Phase.STREAMING:
            return []
        self.last_progress = now
        index = self.media_chunks
        self.media_chunks += 1
        return self._chunk(data, frames, "media", index)

    def finished(self, trailer: bytes, frames: int, now: float) -> list[Effect]:
        """The generation ended: the encoder's last bytes (``frames`` in them), then done."""
        if self.phase is not Phase.STREAMING:
            return []
        effects = self._chunk(trailer, frames, "trailer", None) if trailer else []
        return self._finish(*effects, self._done(False), Close(1000, "done"))

    def failed(self, message: str, now: float, *, code: str = "generation_failed") -> list[Effect]:
        """The generation raised: the client gets a generic error (no traceback); ``code``
        ``engine_unavailable`` where its engine process died."""
        if self.phase is not Phase.STREAMING:
            return []
        return self._finish(self._error(message, code), Close(1011, "failed"))

    def tick(self, now: float) -> list[Effect]:
        """The start or stall timeout, if it has passed."""
        deadline = self.deadline
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.AWAITING_START:
            message = f"Start timeout: no session.start within {self.start_timeout_s:g} s"
            return self._finish(self._error(message, "start_timeout"), Close(1008, "start_timeout"))
        return self._finish(
            StopGeneration(),
            self._error("Stall timeout: no generation progress", "stall_timeout"),
            Close(1011, "stall_timeout"),
        )
