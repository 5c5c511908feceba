"""The OpenPI wire, without sockets: the msgpack-numpy codec and one connection's state.

The codec is checked against what openpi-client's own ``msgpack_numpy`` writes (its
markers are reproduced here byte for byte: bytes keys, ``dtype.str``, the shape as an
array), by round trips over generated arrays, and by fuzz: any bytes in is a value or
an ``InvalidPayload``, never another exception.
"""

from __future__ import annotations

import contextlib
import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from duplex.exceptions import InvalidPayload
from duplex.wire._openpi import (
    INTERNAL_ERROR,
    INVALID_PAYLOAD,
    MAX_PAYLOAD_BYTES,
    Answer,
    Infer,
    OpenPIProtocol,
    pack,
    unpack,
)


def openpi_client_pack(obj: object) -> bytes:
    """What ``openpi_client.msgpack_numpy.packb`` writes (its ``pack_array`` hook)."""

    def hook(value: object) -> object:
        if isinstance(value, np.ndarray):
            return {
                b"__ndarray__": True,
                b"data": value.tobytes(),
                b"dtype": value.dtype.str,
                b"shape": value.shape,
            }
        if isinstance(value, np.generic):
            return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
        return value

    return msgpack.packb(obj, default=hook)


def legacy_pack(obj: object) -> bytes:
    """What the ``msgpack-numpy`` library writes (the legacy marker vLLM-Omni reads)."""

    def hook(value: object) -> object:
        if isinstance(value, np.ndarray):
            return {
                b"nd": True,
                b"type": value.dtype.str,
                b"kind": b"",
                b"shape": value.shape,
                b"data": value.tobytes(),
            }
        if isinstance(value, np.generic):
            return {b"nd": False, b"type": value.dtype.str, b"data": value.tobytes()}
        return value

    return msgpack.packb(obj, default=hook)


ALLOWED_DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="="),
    hnp.unsigned_integer_dtypes(endianness="="),
    hnp.floating_dtypes(endianness="=", sizes=(16, 32, 64)),
    hnp.integer_dtypes(endianness=">"),
)
ARRAYS = hnp.arrays(ALLOWED_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@given(ARRAYS)
def test_arrays_round_trip_through_our_packer(array: np.ndarray) -> None:
    decoded = unpack(pack({"x": array}))["x"]
    assert same(decoded, array)
    assert not decoded.flags.writeable  # a view over the frame, as openpi-client gives


@given(ARRAYS)
def test_openpi_client_frames_decode(array: np.ndarray) -> None:
    assert same(unpack(openpi_client_pack({"x": array}))["x"], array)


@given(ARRAYS)
def test_legacy_frames_decode(array: np.ndarray) -> None:
    assert same(unpack(legacy_pack({"x": array}))["x"], array)


@given(ARRAYS)
def test_our_frames_are_openpi_client_frames(array: np.ndarray) -> None:
    """Byte for byte what openpi-client writes, so its unpacker reads ours."""
    value = {"actions": np.ascontiguousarray(array), "n": 3}
    assert pack(value) == openpi_client_pack(value)


def test_the_markers_use_bytes_keys() -> None:
    raw = msgpack.unpackb(pack(np.zeros((2, 3), np.float32)), raw=False)
    assert raw == {
        b"__ndarray__": True,
        b"data": bytes(24),
        b"dtype": "<f4",
        b"shape": [2, 3],
    }
    scalar = msgpack.unpackb(pack(np.int64(7)), raw=False)
    assert scalar == {b"__npgeneric__": True, b"data": 7, b"dtype": "<i8"}


@pytest.mark.parametrize(
    "scalar", [np.float32(1.5), np.int64(-3), np.uint8(200), np.bool_(True), np.int16(7)]
)
def test_numpy_scalars_round_trip(scalar: np.generic) -> None:
    for frame in (pack(scalar), openpi_client_pack(scalar), legacy_pack(scalar)):
        decoded = unpack(frame)
        assert type(decoded) is type(scalar) and decoded == scalar


def test_float64_scalars_are_plain_floats_as_upstream() -> None:
    assert unpack(pack(np.float64(0.25))) == 0.25


def test_nested_maps_and_lists_keep_their_arrays() -> None:
    value = {"images": {"a": np.ones((2, 2), np.uint8)}, "list": [np.arange(3), "x", None]}
    decoded = unpack(pack(value))
    assert same(decoded["images"]["a"], value["images"]["a"])
    assert same(decoded["list"][0], np.arange(3)) and decoded["list"][1:] == ["x", None]


def test_str_keyed_markers_decode_too() -> None:
    frame = msgpack.packb({"__ndarray__": True, "data": bytes(4), "dtype": "<i4", "shape": [1]})
    assert same(unpack(frame), np.zeros(1, np.int32))


FORBIDDEN = [np.dtype("O"), np.dtype("c8"), np.dtype("c16"), np.dtype([("a", "<i4")])]


@pytest.mark.parametrize("dtype", FORBIDDEN, ids=str)
def test_object_structured_and_complex_dtypes_are_refused_both_ways(dtype: np.dtype) -> None:
    with pytest.raises(ValueError):
        pack(np.zeros(2, dtype))
    header = {b"__ndarray__": True, b"data": bytes(2 * dtype.itemsize), b"shape": [2]}
    with pytest.raises(InvalidPayload, match="dtype"):
        unpack(msgpack.packb({**header, b"dtype": dtype.str}))
    legacy = {b"nd": True, b"type": dtype.str, b"kind": b"", b"shape": [2]}
    with pytest.raises(InvalidPayload, match="dtype"):
        unpack(msgpack.packb({**legacy, b"data": bytes(2 * dtype.itemsize)}))


def test_a_legacy_object_array_is_never_unpickled() -> None:
    """msgpack-numpy writes object arrays as pickles (``kind: 'O'``); they are refused."""
    frame = msgpack.packb(
        {b"nd": True, b"type": [["", "|O"]], b"kind": b"O", b"shape": [1], b"data": b"\x80\x04."}
    )
    with pytest.raises(InvalidPayload):
        unpack(frame)


MARKER = {b"__ndarray__": True, b"data": bytes(8), b"dtype": "<f4", b"shape": [2]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({b"data": bytes(7)}, "bytes"),
        ({b"data": "text"}, "bytes"),
        ({b"shape": [3]}, "bytes"),
        ({b"shape": [-2]}, "shape"),
        ({b"shape": "2"}, "shape"),
        ({b"shape": [1] * 40}, "shape"),
        ({b"shape": None}, "shape"),
        ({b"dtype": "<q9"}, "dtype"),
        ({b"dtype": 4}, "dtype"),
        ({b"dtype": None}, "dtype"),
    ],
)
def test_broken_markers_are_invalid_payloads(change: dict, message: str) -> None:
    with pytest.raises(InvalidPayload, match=message):
        unpack(msgpack.packb({**MARKER, **change}))


def test_missing_marker_keys_are_invalid_payloads() -> None:
    for key in (b"data", b"dtype", b"shape"):
        marker = {k: v for k, v in MARKER.items() if k != key}
        with pytest.raises(InvalidPayload):
            unpack(msgpack.packb(marker))


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",  # never used
        b"\x92\x01",  # an array missing an item
        b"\x01\x02",  # two values
        b"\x81\x91\x01\x01",  # a list as a map key
        b"\xa2\xff\xfe",  # invalid UTF-8
        b"\x91" * 5000,  # nesting deeper than msgpack's stack
        msgpack.packb(msgpack.ExtType(5, b"x")),
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 G items
    ],
)
def test_malformed_msgpack_is_an_invalid_payload(frame: bytes) -> None:
    with pytest.raises(InvalidPayload):
        unpack(frame)


@settings(max_examples=400)
@given(st.binary(max_size=256))
def test_any_bytes_are_a_value_or_an_invalid_payload(frame: bytes) -> None:
    with contextlib.suppress(InvalidPayload):
        unpack(frame)


MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MARKER_KEYS = st.sampled_from(
    [b"__ndarray__", b"__npgeneric__", b"nd", b"data", b"dtype", b"shape", b"type", b"kind"]
)
MARKERISH = st.dictionaries(
    MARKER_KEYS,
    st.booleans()
    | st.binary(max_size=16)
    | st.sampled_from(["<f4", "|u1", "<i8", "|b1", "<U3", "|O", "<c8", "V8", "x", ""])
    | st.lists(st.integers(-2, 4), max_size=3)
    | st.integers(-2, 300)
    | st.floats(),
    max_size=6,
)


@settings(max_examples=400)
@given(st.one_of(MARKERISH, st.lists(MARKERISH, max_size=3), MSGPACK_VALUES))
def test_marker_shaped_maps_are_a_value_or_an_invalid_payload(value: object) -> None:
    """Structured fuzz: well-formed msgpack whose maps look like markers, valid or not."""
    try:
        frame = msgpack.packb(value)
    except (ValueError, OverflowError):
        return
    with contextlib.suppress(InvalidPayload):
        unpack(frame)


# -- the connection's state ---------------------------------------------------------------


def protocol() -> OpenPIProtocol:
    return OpenPIProtocol({"action_horizon": 10})


def infer(p: OpenPIProtocol, now: float = 0.0, **request: object) -> Infer:
    decision = p.receive(pack({"observation/state": np.zeros(2, np.float32), **request}), now)
    assert isinstance(decision, Infer), decision
    return decision


def answered(p: OpenPIProtocol, now: float = 0.0) -> dict:
    frame = p.inferred({"actions": np.zeros((10, 2), np.float32)}, infer_ms=1.5)
    p.sent(now)
    return unpack(frame)


def test_the_handshake_is_the_metadata() -> None:
    assert unpack(protocol().handshake()) == {"action_horizon": 10}


def test_the_first_inference_of_a_session_resets_and_the_next_does_not() -> None:
    p = protocol()
    first = infer(p)
    assert (first.session_id, first.reset) == ("default", True)
    assert "endpoint" not in first.observation
    answered(p)
    assert infer(p).reset is False


def test_a_failed_first_inference_leaves_the_reset_pending() -> None:
    p = protocol()
    assert infer(p).reset is True
    assert unpack(p.failed()) == {"type": "error", "message": INTERNAL_ERROR}
    assert infer(p).reset is True


def test_a_new_session_id_resets_and_an_absent_one_keeps_the_session() -> None:
    p = protocol()
    infer(p, session_id="a")
    answered(p)
    kept = infer(p)
    assert (kept.session_id, kept.reset) == ("a", False)
    answered(p)
    switched = infer(p, session_id="b")
    assert (switched.session_id, switched.reset) == ("b", True)
    answered(p)
    assert infer(p, session_id=7).session_id == "7"


def test_reset_answers_and_makes_the_next_inference_reset() -> None:
    p = protocol()
    infer(p, session_id="a")
    answered(p)
    decision = p.receive(pack({"endpoint": "reset"}), 0.0)
    assert isinstance(decision, Answer) and decision.error is None
    assert unpack(decision.frame) == {"status": "reset successful"}
    after = infer(p, endpoint="infer")
    assert (after.session_id, after.reset) == ("default", True)


def test_server_timing_carries_prev_total_from_the_second_answer() -> None:
    p = protocol()
    infer(p, now=10.0)
    first = answered(p, now=10.25)
    assert first["server_timing"] == {"infer_ms": 1.5}
    infer(p, now=11.0)
    second = answered(p, now=11.5)
    assert second["server_timing"] == {"infer_ms": 1.5, "prev_total_ms": 250.0}
    assert second["actions"].shape == (10, 2)


def test_an_array_result_is_sent_bare() -> None:
    p = protocol()
    infer(p)
    frame = p.inferred(np.ones(3, np.float32), infer_ms=1.0)
    assert same(unpack(frame), np.ones(3, np.float32))


def test_an_unsendable_result_raises_for_the_caller_to_answer_failed() -> None:
    p = protocol()
    infer(p)
    with pytest.raises((TypeError, ValueError)):
        p.inferred({"actions": object()}, infer_ms=1.0)
    with pytest.raises(ValueError):
        p.inferred({"actions": np.zeros(2, np.complex64)}, infer_ms=1.0)
    assert infer(p).reset is True  # nothing was answered: the reset is still pending


BAD_REQUESTS = [
    pytest.param("{}", id="json-text-frame"),
    pytest.param(b"\x00\x01garbage", id="not-msgpack"),
    pytest.param(pack([1, 2]), id="not-a-map"),
    pytest.param(pack({b"observation": 1}), id="bytes-keys"),
    pytest.param(pack({"endpoint": "train"}), id="unknown-endpoint"),
    pytest.param(pack({"endpoint": 3}), id="endpoint-not-text"),
    pytest.param(pack({"session_id": ["a"]}), id="session-id-list"),
    pytest.param(pack({"session_id": "s" * 300}), id="session-id-too-long"),
    pytest.param(pack({"x": np.zeros(2, np.float32)})[:-3], id="truncated"),
    pytest.param(
        msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]}}),
        id="object-dtype",
    ),
    pytest.param(
        msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "<f4"}}),
        id="marker-missing-shape",
    ),
]


@pytest.mark.parametrize("frame", BAD_REQUESTS)
def test_bad_requests_answer_invalid_payload_and_change_nothing(frame: bytes | str) -> None:
    p = protocol()
    infer(p, session_id="a")
    answered(p)
    decision = p.receive(frame, 0.0)
    assert isinstance(decision, Answer) and isinstance(decision.error, InvalidPayload)
    assert unpack(decision.frame) == {"type": "error", "message": INVALID_PAYLOAD}
    assert p.refused == 1
    after = infer(p)  # still usable, still in session "a"
    assert (after.session_id, after.reset) == ("a", False)


def test_oversized_frames_are_refused_unread_and_the_limit_itself_is_read() -> None:
    p = OpenPIProtocol({}, max_payload_bytes=1024)
    overhead = len(pack({"p": bytes(300)})) - 300
    at_limit = pack({"p": bytes(1024 - overhead)})
    assert len(at_limit) == 1024
    assert isinstance(p.receive(at_limit, 0.0), Infer)
    over = pack({"p": bytes(1025 - overhead)})
    decision = p.receive(over, 0.0)
    assert isinstance(decision, Answer) and decision.error is not None
    assert "bytes" in decision.error.message
    assert isinstance(p.receive(at_limit, 0.0), Infer)  # and it recovers


def test_the_default_limit_is_64_mib() -> None:
    assert MAX_PAYLOAD_BYTES == 64 * 1024 * 1024 == OpenPIProtocol({}).max_payload_bytes


def test_an_observation_with_images_reaches_the_policy_intact() -> None:
    p = protocol()
    image = np.arange(math.prod((4, 6, 3)), dtype=np.uint8).reshape(4, 6, 3)
    decision = p.receive(
        openpi_client_pack({"observation/image": image, "prompt": "pick", "session_id": "s"}),
        0.0,
    )
    assert isinstance(decision, Infer)
    assert same(decision.observation["observation/image"], image)
    assert decision.observation["prompt"] == "pick"
