"""Wire events as JSON text: the one serialisation, and the pieces of the per-frame template.

Every projection builds a wire event as a JSON-ready dict and writes it with
`dumps`. The one event sent for every 80 ms frame of every session, the audio
delta, is written from a string template instead: ``json.dumps`` of its dict
spends most of its time scanning ~5 KB of base64 for characters to escape, and
base64 has none. The template writes each value with `string` and `number`,
exactly as `dumps` would, so its text equals `dumps` of the dict the projection
builds for the same event (tests check it on random events).

Inbound, the helper every codec reads a large field with: `b64_decode`, which reads
the text without copying it (docs/protocol/duplex.md, "Limits and defaults", gives
the memory one 16 MiB append costs). A frame's size is ``_envelope.frame_size``.
"""

from __future__ import annotations

import binascii
import json
import math
from collections.abc import Mapping
from typing import Any

from duplex.exceptions import ProtocolError

__all__ = ["b64", "b64_decode", "dumps", "number", "string"]


def dumps(wire: Mapping[str, Any]) -> str:
    """The compact JSON text of one wire event."""
    return json.dumps(wire, separators=(",", ":"))


def b64(data: bytes) -> str:
    """Base64 of audio bytes; none of its characters needs escaping in JSON."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def b64_decode(value: str, param: str, exc: type[ProtocolError]) -> bytes:
    """The bytes of strict base64 text (``base64.b64decode(..., validate=True)``).

    `binascii.a2b_base64` reads an ASCII str in place; ``b64decode`` would first copy
    it to bytes, one more message-sized buffer.

    Raises:
        ProtocolError: ``exc`` naming ``param``: not base64, or not ASCII.
    """
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError) as err:
        raise exc(f"{param} is not valid base64", param=param) from err


def string(value: str) -> str:
    """A JSON string, as `dumps` writes it."""
    return json.dumps(value)


def number(value: float | None) -> str:
    """A JSON number or ``null``, as `dumps` writes it (plain ints and finite floats
    without going through the encoder)."""
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return json.dumps(value)
