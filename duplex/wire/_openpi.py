"""OpenPI's robot policy protocol, sans-I/O: msgpack-numpy frames and one connection's state.

The wire is openpi-client's (``openpi_client.msgpack_numpy``), so a robot written
for OpenPI's ``WebsocketPolicyServer`` connects unchanged:

- an ndarray is a map with **bytes** keys ``__ndarray__: True``, ``data`` (the
  C-order bytes), ``dtype`` (``dtype.str``, e.g. ``'<f4'``) and ``shape``;
- a NumPy scalar is ``__npgeneric__: True``, ``data`` (``item()``), ``dtype``.

On input the legacy marker of the ``msgpack-numpy`` library, which vLLM-Omni
also accepts, is read too: ``nd: True, type, kind, shape, data`` for an array
and ``nd: False, type, data`` for a scalar (``kind`` is ``''`` for ordinary
dtypes). Object, structured (void) and complex dtypes are refused both ways:
an object array would need pickle, which never runs here.

The connection (`OpenPIProtocol`) is request/response after one handshake frame:

    connect                 -> metadata frame (the policy's metadata)
    {endpoint: "infer", session_id?, ...observation}
                            -> the policy's result, with server_timing
    {endpoint: "reset"}     -> {"status": "reset successful"}
    anything unreadable     -> {"type": "error", "message": "Invalid request payload"}
    inference failure       -> {"type": "error", "message": "Internal inference error"}

Every malformed frame becomes `InvalidPayload` (never another exception) and
the connection stays usable. The state is which session the robot is in and
whether its next inference must tell the policy ``reset=True``: the first of a
session, the first after a ``reset``, the first after ``session_id`` changes,
until one succeeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

import msgpack
import numpy as np

from duplex.exceptions import InvalidPayload

MAX_PAYLOAD_BYTES: Final = 64 * 1024 * 1024
"""Largest inbound frame read (as vLLM-Omni's robot endpoint); a larger one is refused."""

MAX_SESSION_ID_CHARS: Final = 256
MAX_DIMS: Final = 32
FORBIDDEN_KINDS: Final = frozenset("VOc")
"""dtype kinds refused: structured/void, object (pickle), complex (as openpi-client)."""

DEFAULT_SESSION: Final = "default"
INVALID_PAYLOAD: Final = "Invalid request payload"
INTERNAL_ERROR: Final = "Internal inference error"
NOT_AVAILABLE: Final = "Robot policy not available"
RESET_DONE: Final = {"status": "reset successful"}


# -- the codec -----------------------------------------------------------------------------


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in FORBIDDEN_KINDS:
        raise ValueError(f"unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    """One frame in openpi-client's format.

    Raises:
        ValueError: an array of a refused dtype.
        TypeError: a value msgpack cannot carry (a torch tensor, a set, ...).
    """
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidPayload(f"{what} is not ASCII") from None
    if isinstance(value, str):
        return value
    raise InvalidPayload(f"{what} must be a string")


def _dtype(value: Any) -> np.dtype[Any]:
    text = _text(value, "dtype")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError, OverflowError, MemoryError) as exc:
        raise InvalidPayload(f"unknown dtype {text[:40]!r}") from exc
    if dtype.kind in FORBIDDEN_KINDS or dtype.hasobject or dtype.itemsize == 0:
        raise InvalidPayload(f"unsupported dtype {text[:40]!r}")
    return dtype


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_DIMS:
        raise InvalidPayload(f"shape must be a list of at most {MAX_DIMS} sizes")
    if not all(type(n) is int and n >= 0 for n in value):
        raise InvalidPayload("shape sizes must be integers >= 0")
    return tuple(value)


def _array(data: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(data, bytes):
        raise InvalidPayload("array data must be bytes")
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise InvalidPayload(f"array data is {len(data)} bytes, not {shape} of {dtype.str}")
    # a read-only view over the frame, as openpi-client's own decoder gives
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _get(obj: dict[Any, Any], key: str, default: Any = None) -> Any:
    """A marker field under a bytes key (openpi-client) or a str key (other encoders)."""
    value = obj.get(key.encode(), default)
    return obj.get(key, default) if value is default else value


_MISSING = object()


def _decode_map(obj: dict[Any, Any]) -> Any:
    """msgpack's object hook: a marker map becomes its array or scalar; others stay maps."""
    if _get(obj, "__ndarray__") is True:
        return _array(
            _get(obj, "data"), _dtype(_get(obj, "dtype")), _shape(_get(obj, "shape", _MISSING))
        )
    if _get(obj, "__npgeneric__") is True:
        dtype, data = _dtype(_get(obj, "dtype")), _get(obj, "data", _MISSING)
        if isinstance(data, bool | int | float | str | bytes):
            try:
                return dtype.type(data)
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidPayload(f"scalar does not fit {dtype.str}") from exc
        raise InvalidPayload("scalar data must be a number, string or bytes")
    nd = _get(obj, "nd", _MISSING)
    if isinstance(nd, bool) and _get(obj, "type", _MISSING) is not _MISSING:
        return _legacy(obj, nd)
    return obj


def _legacy(obj: dict[Any, Any], nd: bool) -> Any:
    """``msgpack-numpy``'s marker (``nd``, ``type``, ``kind``, ``shape``, ``data``)."""
    dtype = _dtype(_get(obj, "type"))
    kind = _get(obj, "kind", b"")
    if _text(kind, "kind") not in ("", dtype.kind):
        raise InvalidPayload("kind does not match the dtype")
    if nd:
        return _array(_get(obj, "data"), dtype, _shape(_get(obj, "shape", _MISSING)))
    return _array(_get(obj, "data"), dtype, (1,))[0]


def _refuse_ext(code: int, data: bytes) -> Any:
    raise InvalidPayload(f"msgpack extension type {code} is not accepted")


def unpack(frame: bytes) -> Any:
    """One inbound frame's value; arrays are read-only views over ``frame``.

    Raises:
        InvalidPayload: anything but one well-formed msgpack value with valid markers
            (the cause, when msgpack raised, is chained).
    """
    try:
        return msgpack.unpackb(
            frame,
            object_hook=_decode_map,
            ext_hook=_refuse_ext,
            raw=False,
            strict_map_key=True,
        )
    except InvalidPayload:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        # FormatError, StackError, ExtraData, UnicodeDecodeError, bad map keys, ...
        raise InvalidPayload(f"not one msgpack value: {type(exc).__name__}") from exc


# -- the connection ------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Infer:
    """Run the policy on ``observation`` (the frame's map without ``endpoint``).

    ``reset``: the policy must start this session afresh.
    """

    session_id: str
    reset: bool
    observation: dict[str, Any] = field(repr=False)


@final
@dataclass(frozen=True, slots=True)
class Answer:
    """Send ``frame`` and read the next request; ``error``: the refusal it carries."""

    frame: bytes = field(repr=False)
    error: InvalidPayload | None = None


Received = Infer | Answer


def error_frame(message: str) -> bytes:
    """``{"type": "error", "message": message}``, as vLLM-Omni's robot endpoint sends it."""
    return pack({"type": "error", "message": message})


@final
class OpenPIProtocol:
    """One robot connection's protocol state: frames in, decisions and frames out.

    Time is passed in (``now``, seconds on any monotonic clock) and used only for
    ``server_timing.prev_total_ms``: the previous request's time from its frame
    arriving to its answer being written.

    Args:
        metadata: the policy's metadata, the connection's first frame.
        max_payload_bytes: larger inbound frames are refused unread.
    """

    def __init__(
        self, metadata: Mapping[str, Any], *, max_payload_bytes: int = MAX_PAYLOAD_BYTES
    ) -> None:
        self.metadata = dict(metadata)
        self.max_payload_bytes = max_payload_bytes
        self.session_id: str | None = None
        self.reset_pending = True
        self.received_at: float | None = None
        self.prev_total_ms: float | None = None
        self.refused = 0
        self.inferences = 0

    def handshake(self) -> bytes:
        """The first frame: the policy's metadata."""
        return pack(self.metadata)

    def receive(self, frame: bytes | str, now: float) -> Received:
        """What to do with one inbound frame; never raises."""
        self.received_at = now
        try:
            request = self._parse(frame)
        except InvalidPayload as exc:
            self.refused += 1
            return Answer(error_frame(INVALID_PAYLOAD), exc)
        endpoint = request.pop("endpoint", "infer")
        if endpoint == "reset":
            self.session_id = None
            self.reset_pending = True
            return Answer(pack(RESET_DONE))
        session_id = _session_id(request.get("session_id")) or self.session_id or DEFAULT_SESSION
        if session_id != self.session_id:
            self.session_id = session_id
            self.reset_pending = True
        return Infer(session_id, self.reset_pending, request)

    def _parse(self, frame: bytes | str) -> dict[str, Any]:
        if isinstance(frame, str):
            raise InvalidPayload("a text frame is not an observation: send binary msgpack")
        if len(frame) > self.max_payload_bytes:
            raise InvalidPayload(f"frame of {len(frame)} bytes > {self.max_payload_bytes}")
        request = unpack(frame)
        if not isinstance(request, dict):
            raise InvalidPayload("a request must be a map")
        if not all(isinstance(key, str) for key in request):
            raise InvalidPayload("a request's keys must be strings")
        endpoint = request.get("endpoint", "infer")
        if endpoint not in ("infer", "reset"):
            raise InvalidPayload("endpoint must be 'infer' or 'reset'")
        _session_id(request.get("session_id"))
        return request

    def inferred(self, result: Any, infer_ms: float) -> bytes:
        """The answer to the `Infer` just returned: the policy's ``result`` with
        ``server_timing`` added when it is a map.

        The session's pending reset is done once this is built.

        Raises:
            ValueError, TypeError: ``result`` cannot be sent (the caller answers
                `failed` instead).
        """
        if isinstance(result, Mapping):
            timing = {"infer_ms": infer_ms}
            if self.prev_total_ms is not None:
                timing["prev_total_ms"] = self.prev_total_ms
            result = {**result, "server_timing": timing}
        frame = pack(result)
        self.reset_pending = False
        self.inferences += 1
        return frame

    def failed(self) -> bytes:
        """The answer to an `Infer` whose inference failed (the cause stays here)."""
        return error_frame(INTERNAL_ERROR)

    def sent(self, now: float) -> None:
        """An answer to an inference was written at ``now``."""
        if self.received_at is not None:
            self.prev_total_ms = (now - self.received_at) * 1000.0


def _session_id(value: Any) -> str | None:
    """A request's ``session_id``: a string or an integer (as text); absent or empty: ``None``.

    Raises:
        InvalidPayload: another type, or longer than `MAX_SESSION_ID_CHARS`.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidPayload("session_id must be a string")
    text = str(value)
    if len(text) > MAX_SESSION_ID_CHARS:
        raise InvalidPayload(f"session_id longer than {MAX_SESSION_ID_CHARS} characters")
    return text
