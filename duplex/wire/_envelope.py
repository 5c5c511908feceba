"""The envelope of one client frame, read once for every wire projection.

Every JSON projection (native ``/v1/duplex``, OpenAI Realtime) starts a frame the
same way: size, text frame, JSON, an object, its ``type``, its ``event_id``. Two
copies of these checks drifted, so there is one, `read_envelope`; a projection
dispatches on the `Envelope` it returns and reads its own fields from ``body``.

Like the rest of a codec it is sans-I/O, and only a `ProtocolError` leaves it:
``event_too_large``, ``binary_frame_unsupported``, ``invalid_json`` or
``bad_event``, with ``event_id`` set from the first check on whenever the frame
carried a readable one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, final

from duplex.exceptions import BadEvent, BinaryFrameUnsupported, EventTooLarge, InvalidJson

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "Envelope", "frame_size", "read_envelope"]

DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024


@final
@dataclass(frozen=True, slots=True)
class Envelope:
    """One client frame's JSON object and the two fields every projection reads first.

    Args:
        type: the event name, a string (not yet checked against any projection's names).
        event_id: the client's id for the event, or ``None`` when absent or ``null``.
        body: the whole JSON object, ``type`` and ``event_id`` included. The
            projection owns it: it pops a large field (base64 audio) once decoded,
            so the text is freed before the samples are made.
    """

    type: str
    event_id: str | None
    body: dict[str, Any]


def frame_size(text: str) -> int:
    """The size of a text frame: its UTF-8 bytes, O(1) when it is ASCII.

    Lone surrogates (only a caller in-process can pass them; a WebSocket text frame
    is valid UTF-8) count the three bytes ``surrogatepass`` writes, instead of
    raising ``UnicodeEncodeError``.
    """
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _too_large(text: str, max_size: int) -> bool:
    """`frame_size` over ``max_size``, without encoding when the length decides it."""
    if len(text) > max_size:  # every character is at least one byte
        return True
    return len(text) * 4 > max_size and frame_size(text) > max_size  # at most four


def read_envelope(data: str | bytes, *, max_size: int = DEFAULT_MAX_EVENT_BYTES) -> Envelope:
    """Check one WebSocket message up to its ``type`` and ``event_id``.

    Python's JSON parser is used as is: ``NaN``, ``Infinity`` and ``-Infinity`` are
    accepted (fields that take numbers range-check them), a repeated key keeps its
    last value, and integers over 4300 digits or nesting past the recursion limit
    are ``invalid_json``.

    Args:
        data: a text frame (``str``); ``bytes`` means a binary frame, which is refused.
        max_size: the largest accepted message, in bytes (`frame_size` for text).

    Returns:
        The frame's `Envelope`.

    Raises:
        EventTooLarge: over ``max_size`` (checked first, binary frames too).
        BinaryFrameUnsupported: a binary frame.
        InvalidJson: not JSON.
        BadEvent: not an object; ``event_id`` neither a string nor ``null``; ``type``
            missing or not a string (``param`` names the field, ``event_id`` is set).
    """
    if not isinstance(data, str):
        if len(data) > max_size:
            raise EventTooLarge(f"message is over {max_size} bytes")
        raise BinaryFrameUnsupported("binary frames are not accepted; send JSON text")
    if _too_large(data, max_size):
        raise EventTooLarge(f"message is over {max_size} bytes")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InvalidJson(f"invalid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadEvent("an event must be a JSON object")
    event_id = body.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise BadEvent("event_id must be a string", param="event_id")
    kind = body.get("type")
    if kind is None:
        raise BadEvent("missing required field 'type'", event_id=event_id, param="type")
    if not isinstance(kind, str):
        raise BadEvent("type must be a string", event_id=event_id, param="type")
    return Envelope(kind, event_id, body)
