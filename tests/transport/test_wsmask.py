"""The numpy unmasker is wsproto's, byte for byte, over any split of a frame into chunks."""

from __future__ import annotations

import wsproto.frame_protocol
from hypothesis import given
from hypothesis import strategies as st

import duplex.transport._http  # installs the masker
from duplex.transport._wsmask import WSPROTO_MASKER, NumpyXorMasker


def test_the_server_unmasks_with_numpy() -> None:
    assert duplex.transport._http is not None
    assert wsproto.frame_protocol.XorMaskerSimple is NumpyXorMasker
    assert WSPROTO_MASKER is not NumpyXorMasker


@given(
    st.binary(min_size=4, max_size=4),
    st.lists(st.binary(max_size=64), max_size=6),
)
def test_it_matches_wsproto_over_any_chunks(key: bytes, chunks: list[bytes]) -> None:
    ours, theirs = NumpyXorMasker(key), WSPROTO_MASKER(bytearray(key))
    for chunk in chunks:
        mine = ours.process(bytearray(chunk))
        assert isinstance(mine, bytearray)
        assert mine == theirs.process(bytearray(chunk))
    assert NumpyXorMasker(key).process(NumpyXorMasker(key).process(b"abcdefg")) == b"abcdefg"


def test_a_large_frame() -> None:
    data = bytes(range(256)) * 1200 + b"xyz"
    key = b"\x01\x02\x03\x04"
    assert NumpyXorMasker(key).process(data) == WSPROTO_MASKER(key).process(bytearray(data))
