"""The link between a session process and an engine process: its messages and framing.

Sans-I/O, like ``_link.py``, whose ``Link`` carries it (length-prefixed
messages, everything posted since the last write in one ``send_all``). Each
tick costs one message per session process in each direction, however many of
its sessions the tick served:

- ``SlotCommands``: the audio, video and resets the process's sessions pushed
  since its last write, in push order (one session's commands never reorder);
- ``TickOutputs``: every output of one tick for the slots that process holds.

Both are framed by hand (a struct per entry, then raw PCM), because pickle's
cost per dataclass (10-20 us each way, measured for ``_link.py``) times 128
slots would be a few milliseconds of every 80 ms tick on each side. The rare
messages (open and close a slot, the engine's status, its greeting, and the
requests for the request-batched models the engine process hosts, with their
answers) are pickles: both ends are our own processes from one install
(``CODE_FINGERPRINT``).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, final

import numpy as np

from duplex.models import (
    CapacityReport,
    DriverStatistics,
    FrameOutput,
    ModelSpec,
    Priority,
    RecorderSnapshot,
    RequestEngineStatistics,
    SlotHandle,
    SlotOutput,
    SlotPrompt,
)

from ._link import HEADER, LinkBroken

# -- rare messages (pickled) ---------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class RunnerInfo:
    """A request-batched model an engine process hosts, and what clients are told of it."""

    name: str
    metadata: Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class Hello:
    """The engine process's greeting on every link: what it serves."""

    spec: ModelSpec
    index: int
    runners: tuple[RunnerInfo, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """A session process's request for the engine process's runner ``runner``."""

    request: int
    runner: str
    payload: Any
    priority: Priority = Priority.BATCH


@final
@dataclass(frozen=True, slots=True)
class CancelRequest:
    """The client of ``request`` left: withdraw it (or drop its result)."""

    request: int


@final
@dataclass(frozen=True, slots=True)
class RequestDone:
    """A request's answer: its result and batch cost, or ``error`` (with ``retry_after_s``
    when the queue was full)."""

    request: int
    result: Any = None
    run_ms: float = 0.0
    batch_size: int = 0
    error: str | None = None
    retry_after_s: float | None = None


@final
@dataclass(frozen=True, slots=True)
class OpenSlot:
    """A session process asks for a slot for ``owner`` (the session id)."""

    request: int
    owner: str
    prompt: SlotPrompt | None


@final
@dataclass(frozen=True, slots=True)
class SlotOpened:
    """The engine's answer: a slot (``slot``, ``generation``) or a refusal.

    ``error`` is set when the prompt was refused (``PromptUnsupported``'s message);
    ``slot`` is -1 when admission said no. ``report`` is the capacity after it.
    """

    request: int
    slot: int
    generation: int
    report: CapacityReport
    error: str | None = None


@final
@dataclass(frozen=True, slots=True)
class CloseSlot:
    slot: int
    generation: int


@final
@dataclass(frozen=True, slots=True)
class EngineStatus:
    """The engine's capacity and counters, sent every ``STATUS_PERIOD_S`` on every link."""

    report: CapacityReport
    statistics: DriverStatistics
    histograms: RecorderSnapshot | None = None
    """The engine's latency histograms (cumulative), exported by a session process."""
    requests: Mapping[str, RequestEngineStatistics] = field(default_factory=dict)
    trims: tuple[tuple[int, ...], float] | None = None
    """The engine process's ``malloc_trim`` durations (cumulative bucket counts and sum)."""


STATUS_PERIOD_S = 0.25

# -- the per-tick messages (framed by hand) ------------------------------------

_TAG_COMMANDS = 0x10
_TAG_OUTPUTS = 0x11

_PCM, _RESET, _VIDEO = 1, 2, 3
_ENTRY = struct.Struct("<BII")  # kind, slot, generation
_PCM_HEAD = struct.Struct("<I")  # samples, then float32 samples
_RESET_BODY = struct.Struct("<qB")  # epoch, clear_input
_VIDEO_HEAD = struct.Struct("<qHI")  # pts_ms, frame_id bytes, payload bytes

_OUTPUTS_HEAD = struct.Struct("<BqdI")  # tag, tick, at, count
_OUTPUT = struct.Struct("<IIqqqIBIII")
# slot, generation, epoch, position, input_samples, rejected, flags, text, video, pcm16 bytes
_SPEAKING, _END_OF_TURN, _HOLDS_INPUT = 1, 2, 4

NO_PCM = np.zeros(0, np.float32)
"""``FrameOutput.pcm`` of an output that crossed the link: only ``pcm16`` (the wire's form,
which is all a session reads) crosses it."""


@final
@dataclass(frozen=True, slots=True)
class PushPcm:
    slot: int
    generation: int
    pcm: np.ndarray


@final
@dataclass(frozen=True, slots=True)
class PushVideo:
    slot: int
    generation: int
    frame_id: str
    pts_ms: int
    payload: bytes


@final
@dataclass(frozen=True, slots=True)
class Reset:
    slot: int
    generation: int
    epoch: int
    clear_input: bool


Command = PushPcm | PushVideo | Reset


class CommandBatch:
    """A session process's commands since its last write, encoded as they come."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def __bool__(self) -> bool:
        return bool(self._parts)

    def pcm(self, handle: SlotHandle, pcm: np.ndarray) -> None:
        samples = np.ascontiguousarray(pcm, dtype=np.float32)
        self._parts += (
            _ENTRY.pack(_PCM, handle.slot, handle.generation),
            _PCM_HEAD.pack(len(samples)),
            samples.tobytes(),
        )

    def reset(self, handle: SlotHandle, epoch: int, clear_input: bool) -> None:
        self._parts += (
            _ENTRY.pack(_RESET, handle.slot, handle.generation),
            _RESET_BODY.pack(epoch, clear_input),
        )

    def video(self, handle: SlotHandle, frame_id: str, pts_ms: int, payload: bytes) -> None:
        name = frame_id.encode()
        self._parts += (
            _ENTRY.pack(_VIDEO, handle.slot, handle.generation),
            _VIDEO_HEAD.pack(pts_ms, len(name), len(payload)),
            name,
            payload,
        )

    def take(self) -> bytes:
        """The framed message (length included) of everything added; the batch is then empty."""
        body = bytes([_TAG_COMMANDS]) + b"".join(self._parts)
        self._parts = []
        return HEADER.pack(len(body)) + body


def _commands(body: bytes) -> Iterator[Command]:
    at, end = 1, len(body)
    while at < end:
        kind, slot, generation = _ENTRY.unpack_from(body, at)
        at += _ENTRY.size
        if kind == _PCM:
            (samples,) = _PCM_HEAD.unpack_from(body, at)
            at += _PCM_HEAD.size
            pcm = np.frombuffer(body, np.float32, samples, at)
            at += 4 * samples
            yield PushPcm(slot, generation, pcm)
        elif kind == _RESET:
            epoch, clear = _RESET_BODY.unpack_from(body, at)
            at += _RESET_BODY.size
            yield Reset(slot, generation, epoch, bool(clear))
        elif kind == _VIDEO:
            pts_ms, name_size, payload_size = _VIDEO_HEAD.unpack_from(body, at)
            at += _VIDEO_HEAD.size
            frame_id = body[at : at + name_size].decode()
            at += name_size
            payload = body[at : at + payload_size]
            at += payload_size
            yield PushVideo(slot, generation, frame_id, pts_ms, payload)
        else:
            raise LinkBroken(f"an unknown command kind: {kind}")
    if at != end:
        raise LinkBroken("a command batch ends inside a command")


@final
@dataclass(frozen=True, slots=True)
class Commands:
    """A decoded ``SlotCommands`` message (decoded lazily: ``iter``)."""

    body: bytes

    def __iter__(self) -> Iterator[Command]:
        try:
            yield from _commands(self.body)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise LinkBroken(f"an undecodable command batch: {exc!r}") from exc


def encode_outputs(outputs: list[tuple[SlotOutput, int]]) -> bytes:
    """One tick's outputs for one session process (each with the frames the engine refused
    from that slot since its last output), framed (length included)."""
    first = outputs[0][0]
    parts = [_OUTPUTS_HEAD.pack(_TAG_OUTPUTS, first.tick, first.at, len(outputs))]
    for output, rejected in outputs:
        frame = output.frame
        text = frame.text.encode() if frame.text else b""
        video = b""
        if frame.video_frame_ids or frame.latest_video_pts_ms is not None:
            video = pickle.dumps((frame.video_frame_ids, frame.latest_video_pts_ms))
        flags = (
            (_SPEAKING if frame.speaking else 0)
            | (_END_OF_TURN if frame.end_of_turn else 0)
            | (_HOLDS_INPUT if frame.holds_input else 0)
        )
        handle = output.handle
        parts += (
            _OUTPUT.pack(
                handle.slot,
                handle.generation,
                output.epoch,
                output.position,
                output.input_samples,
                rejected,
                flags,
                len(text),
                len(video),
                len(output.pcm16),
            ),
            text,
            video,
            output.pcm16,
        )
    body = b"".join(parts)
    return HEADER.pack(len(body)) + body


def decode_outputs(
    body: bytes, handles: Mapping[tuple[int, int], SlotHandle]
) -> list[tuple[SlotOutput, int]]:
    """The outputs of the slots in ``handles`` (by slot id and generation; others were
    closed while the tick ran), each with the frames the engine refused from it."""
    _, tick, at_time, count = _OUTPUTS_HEAD.unpack_from(body)
    at = _OUTPUTS_HEAD.size
    entries = []
    for _ in range(count):
        (slot, generation, epoch, position, consumed, rejected, flags, text_size, video_size,
         pcm_size) = _OUTPUT.unpack_from(body, at)  # fmt: skip
        at += _OUTPUT.size
        text = body[at : at + text_size].decode() if text_size else ""
        at += text_size
        video_ids: tuple[str, ...] = ()
        latest: int | None = None
        if video_size:
            video_ids, latest = pickle.loads(body[at : at + video_size])
        at += video_size
        pcm16 = body[at : at + pcm_size]
        at += pcm_size
        handle = handles.get((slot, generation))
        if handle is None:
            continue
        frame = FrameOutput(
            slot,
            NO_PCM,
            text,
            speaking=bool(flags & _SPEAKING),
            end_of_turn=bool(flags & _END_OF_TURN),
            video_frame_ids=video_ids,
            latest_video_pts_ms=latest,
            holds_input=bool(flags & _HOLDS_INPUT),
        )
        output = SlotOutput(handle, epoch, tick, at_time, position, consumed, frame, pcm16)
        entries.append((output, rejected))
    if at != len(body):
        raise LinkBroken("a tick's outputs end inside an output")
    return entries


@final
@dataclass(frozen=True, slots=True)
class Outputs:
    """A decoded ``TickOutputs`` message (decoded lazily: ``entries``)."""

    body: bytes

    def entries(
        self, handles: Mapping[tuple[int, int], SlotHandle]
    ) -> list[tuple[SlotOutput, int]]:
        try:
            return decode_outputs(self.body, handles)
        except (struct.error, UnicodeDecodeError, ValueError, pickle.UnpicklingError) as exc:
            raise LinkBroken(f"an undecodable tick of outputs: {exc!r}") from exc


def decode(body: bytes) -> object:
    """One engine-link message from its body."""
    if not body:
        raise LinkBroken("an empty message")
    tag = body[0]
    try:
        if tag == _TAG_COMMANDS:
            return Commands(body)
        if tag == _TAG_OUTPUTS:
            return Outputs(body)
        if tag == 0x80:
            return pickle.loads(body)
    except Exception as exc:
        raise LinkBroken(f"an undecodable message: {exc!r}") from exc
    raise LinkBroken(f"an unknown message tag: {tag:#x}")
