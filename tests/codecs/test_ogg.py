"""The Ogg layer (RFC 3533) and the Opus mapping (RFC 7845) of ``duplex.codecs._ogg``.

Byte-exact checks use pages built here by hand, with a bitwise CRC written independently of
the table the module uses; ``sphn`` (Kyutai's own Ogg/Opus, a Rust ``ogg`` crate underneath)
is the independent peer.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
import sphn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.codecs._ogg import (
    MAX_PAGE_BYTES,
    AudioPacket,
    EndOfStream,
    OggError,
    OggReader,
    OggWriter,
    OpusHead,
    OpusTags,
    ogg_crc32,
)
from duplex.exceptions import BadAudio, ProtocolError

from .oggkit import SERIAL, bitwise_crc, lacing_of, raw_page, table_crc

HEAD = OpusHead(pre_skip=312, input_sample_rate=24_000)
TAGS = OpusTags(b"test", (b"A=b",))


def header_pages(head: OpusHead = HEAD, tags: OpusTags = TAGS) -> bytes:
    h, t = head.to_bytes(), tags.to_bytes()
    return raw_page(lacing_of(len(h)), h, flags=0x02) + raw_page(lacing_of(len(t)), t, seq=1)


def audio(reader: OggReader, data: bytes) -> list[bytes]:
    return [e.data for e in reader.feed(data) if isinstance(e, AudioPacket)]


# --- CRC and page bytes ---------------------------------------------------------------------


def test_crc_matches_the_check_value_a_table_and_the_bitwise_definition() -> None:
    # CRC-32/CKSUM's catalogued check value 0x765E7680 includes a final xor with 0xFFFFFFFF
    assert ogg_crc32(b"123456789") == 0x765E7680 ^ 0xFFFFFFFF == bitwise_crc(b"123456789")
    rng = np.random.default_rng(0)
    for size in (0, 1, 3, 4, 27, 255, 1000):
        blob = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert ogg_crc32(blob) == bitwise_crc(blob) == table_crc(blob)
    blob = bytes(range(256)) * 3
    assert ogg_crc32(blob[100:], ogg_crc32(blob[:100])) == bitwise_crc(blob)  # it continues
    assert ogg_crc32(memoryview(blob)) == ogg_crc32(bytearray(blob)) == table_crc(blob)


def test_header_pages_are_byte_identical_to_sphn() -> None:
    """sphn's writer (Rust ``ogg`` crate) writes serial 42, pre-skip 3840, 48 kHz, vendor
    ``KyutaiMoshi``: given those values ours writes the same 102 bytes, CRCs included."""
    theirs = sphn.OpusStreamWriter(24000).append_pcm(np.zeros(1920, np.float32))
    head = OpusHead(pre_skip=3840, input_sample_rate=48_000)
    ours = OggWriter(serial=42, head=head, tags=OpusTags(b"KyutaiMoshi")).headers()
    assert len(ours) == 47 + 55
    assert theirs[: len(ours)] == ours


def test_writer_page_bytes_by_hand() -> None:
    writer = OggWriter(serial=SERIAL, head=HEAD, tags=TAGS)
    assert writer.headers() == header_pages()
    packet = b"\x08" + bytes(99)
    assert writer.write(packet, 1920) == raw_page([100], packet, seq=2, granule=312 + 1920)
    assert writer.write(packet, 960, last=True) == raw_page(
        [100], packet, seq=3, granule=312 + 2880, flags=0x04
    )
    assert writer.ended
    with pytest.raises(ValueError):
        writer.write(packet, 960)


@pytest.mark.parametrize(
    ("size", "lacing"),
    [(1, [1]), (254, [254]), (255, [255, 0]), (256, [255, 1]), (510, [255, 255, 0])],
)
def test_lacing_of_packet_sizes(size: int, lacing: list[int]) -> None:
    writer = OggWriter(serial=SERIAL, head=HEAD, tags=TAGS)
    writer.headers()
    packet = bytes((i * 7) % 256 for i in range(size))
    page = writer.write(packet, 960)
    assert page[26] == len(lacing) and list(page[27 : 27 + len(lacing)]) == lacing
    assert page == raw_page(lacing, packet, seq=2, granule=312 + 960)
    reader = OggReader()
    reader.feed(header_pages())
    assert reader.feed(page) == [AudioPacket(packet, 312 + 960)]


def test_packet_continued_across_three_pages_and_several_per_page() -> None:
    big = bytes(range(256)) * 3  # 768 bytes: 255 | 255 + 255 | 3
    small = b"\x01\x02\x03"
    stream = (
        header_pages()
        + b"".join(
            [
                raw_page([9, 255], b"\xaa" * 9 + big[:255], seq=2, granule=960),  # ends in a tail
                raw_page([255, 255], big[255:765], flags=0x01, seq=3, granule=-1),  # none ends
                raw_page([3, 3], big[765:] + small, flags=0x01, seq=4, granule=2880),
                raw_page([], b"", seq=5, granule=2880, flags=0x04),  # an empty EOS page
            ]
        )
    )
    reader = OggReader()
    events = reader.feed(stream)
    assert events == [
        HEAD,
        TAGS,
        AudioPacket(b"\xaa" * 9, 960),
        AudioPacket(big, -1),
        AudioPacket(small, 2880),
        EndOfStream(2880),
    ]
    assert reader.ended and reader.statistics().buffered == 0


def test_opus_tags_may_span_pages_and_headers_parse() -> None:
    tags = OpusTags(b"v" * 300, (b"TITLE=" + b"x" * 200, b"K=v"))
    t = tags.to_bytes()
    head = HEAD.to_bytes()
    stream = (
        raw_page([19], head, flags=0x02)
        + raw_page([255], t[:255], seq=1, granule=-1)
        + raw_page(lacing_of(len(t) - 255), t[255:], flags=0x01, seq=2)
        + raw_page([1], b"\x08", seq=3, granule=960)
    )
    assert OggReader().feed(stream) == [HEAD, tags, AudioPacket(b"\x08", 960)]


def test_every_byte_split_gives_the_same_events() -> None:
    writer = OggWriter(serial=SERIAL, head=HEAD, tags=TAGS)
    stream = b"".join(writer.write(bytes([i + 1]) * (i * 50 + 1), 960) for i in range(8))
    whole = OggReader().feed(stream)
    for step in (1, 2, 3, 27, 28, 100):
        reader = OggReader()
        events = []
        for at in range(0, len(stream), step):
            events += reader.feed(stream[at : at + step])
        assert events == whole


# --- refusals ---------------------------------------------------------------------------------


def _bad_streams() -> dict[str, bytes]:
    ok_audio = raw_page([1], b"\x08", seq=2, granule=960)
    head, tags = HEAD.to_bytes(), TAGS.to_bytes()
    headers = header_pages()

    def with_head(packet: bytes) -> bytes:
        return raw_page(lacing_of(len(packet)), packet, flags=0x02)

    return {
        "capture pattern": b"OggT" + headers[4:],
        "leading garbage": b"\x00" + headers,
        "bad crc": raw_page([19], head, flags=0x02, crc=1),
        "version 1": raw_page([19], head, flags=0x02, version=1),
        "undefined flag": raw_page([19], head, flags=0x0A),
        "no BOS first": raw_page([19], head),
        "second BOS": headers + raw_page([1], b"\x08", seq=2, flags=0x02),
        "other serial": headers + raw_page([1], b"\x08", seq=2, serial=1),
        "sequence gap": headers + raw_page([1], b"\x08", seq=3),
        "continued without tail": headers + raw_page([1], b"\x08", seq=2, flags=0x01),
        "tail not continued": headers
        + raw_page([255], bytes(255), seq=2)
        + raw_page([1], b"\x08", seq=3),
        "head not alone": raw_page([19, 1], head + b"\x08", flags=0x02),
        "not OpusHead": with_head(b"OpusHeaX" + head[8:]),
        "short OpusHead": with_head(head[:18]),
        "long OpusHead v1": with_head(head + b"\x00"),
        "OpusHead version 16": with_head(head[:8] + b"\x10" + head[9:]),
        "zero channels": with_head(head[:9] + b"\x00" + head[10:]),
        "three channels": with_head(head[:9] + b"\x03" + head[10:]),
        "mapping family 1": with_head(head[:18] + b"\x01"),
        "header granule": raw_page([19], head, flags=0x02, granule=5),
        "not OpusTags": with_head(head) + raw_page([8], b"OpusTagz", seq=1),
        "tags truncated": with_head(head) + raw_page([len(tags) - 1], tags[:-1], seq=1),
        "tags huge count": with_head(head)
        + raw_page([20], b"OpusTags" + struct.pack("<II", 0, 2**32 - 1) + bytes(4), seq=1),
        "tags with audio": with_head(head) + raw_page([len(tags), 1], tags + b"\x08", seq=1),
        "empty audio packet": headers + raw_page([0], b"", seq=2),
        "after EOS": headers + raw_page([1], b"\x08", seq=2, flags=0x04) + ok_audio,
        "EOS mid-packet": headers + raw_page([255], bytes(255), seq=2, flags=0x04),
    }


@pytest.mark.parametrize("name", sorted(_bad_streams()))
def test_invalid_stream_is_refused_and_poisons_the_reader(name: str) -> None:
    stream = _bad_streams()[name]
    reader = OggReader()
    with pytest.raises(OggError) as info:
        for at in range(0, len(stream), 64):
            reader.feed(stream[at : at + 64])
    assert isinstance(info.value, BadAudio) and isinstance(info.value, ProtocolError)
    assert info.value.code == "bad_audio"
    with pytest.raises(OggError, match="failed earlier"):
        reader.feed(header_pages())
    assert reader.statistics().buffered == 0


def test_garbage_is_refused_at_its_first_byte() -> None:
    with pytest.raises(OggError, match="capture pattern"):
        OggReader().feed(b"X")
    with pytest.raises(OggError, match="capture pattern"):
        OggReader().feed(b"Og\x00")


def test_limits_refuse_before_the_body_arrives() -> None:
    reader = OggReader(max_page_bytes=1000)
    reader.feed(header_pages())
    # a header announcing 255 segments of 255 bytes: refused once its segment table is in
    page = raw_page([255] * 255, bytes(255 * 255), seq=2)
    reader.feed(page[: 27 + 254])
    with pytest.raises(OggError, match="over the limit"):
        reader.feed(page[27 + 254 : 27 + 255])
    reader = OggReader(max_packet_bytes=600)
    reader.feed(header_pages())
    reader.feed(raw_page([255, 255], bytes(510), seq=2))
    with pytest.raises(OggError, match="limit is 600"):
        reader.feed(raw_page([255], bytes(255), seq=3, flags=0x01))
    assert MAX_PAGE_BYTES == 27 + 255 + 255 * 255 == 65_307


def test_largest_page_is_accepted() -> None:
    reader = OggReader()
    reader.feed(header_pages())
    body = bytes(range(255)) * 255
    page = raw_page([255] * 255, body, seq=2, granule=-1)
    assert len(page) == MAX_PAGE_BYTES
    assert reader.feed(page) == []
    assert reader.statistics().buffered == 255 * 255  # the unfinished packet
    assert reader.feed(raw_page([0], b"", flags=0x01, seq=3)) == [AudioPacket(body, 0)]


# --- fuzz -------------------------------------------------------------------------------------

_VALID = header_pages() + b"".join(
    raw_page(lacing_of(n), bytes([n % 256]) * n, seq=2 + i, granule=960 * (i + 1))
    for i, n in enumerate((1, 254, 255, 300, 40))
)
_EVENT_TYPES = (OpusHead, OpusTags, AudioPacket, EndOfStream)
_HELD_BOUND = MAX_PAGE_BYTES + 65_025  # one incomplete page plus one incomplete packet


def _page_starts(data: bytes) -> list[int]:
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        n = data[at + 26]
        at += 27 + n + sum(data[at + 27 : at + 27 + n])
    return starts


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _feed_all(reader: OggReader, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            events = reader.feed(chunk)
            assert all(
                isinstance(e, OpusHead | OpusTags | AudioPacket | EndOfStream) for e in events
            )
            assert reader.statistics().buffered <= _HELD_BOUND
    except OggError:
        pass


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(_VALID)
    kinds = ["flip", "recrc", "truncate", "insert", "random", "segments"]
    kind = draw(st.sampled_from(kinds))
    if kind == "recrc":  # a changed byte under a valid CRC: reaches the semantic checks
        starts = _page_starts(_VALID)
        index = draw(st.integers(0, len(starts) - 1))
        start, end = starts[index], [*starts, len(data)][index + 1]
        at = draw(st.sampled_from([4, 5, 6, 13, 14, 18, 26, 27, 28, 35, end - start - 1]))
        data[start + at] = draw(st.integers(0, 255))
        data[start + 22 : start + 26] = bytes(4)
        struct.pack_into("<I", data, start + 22, bitwise_crc(bytes(data[start:end])))
    elif kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(data) - 1))
            data[at] = draw(st.integers(0, 255))
    elif kind == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif kind == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=64))
    elif kind == "random":
        data = bytearray(b"OggS" * draw(st.booleans()) + draw(st.binary(max_size=600)))
    else:  # a huge segment table with a valid CRC after valid headers
        table = draw(st.lists(st.integers(0, 255), min_size=200, max_size=255))
        page = raw_page(table, bytes(min(sum(table), 2000)), seq=2)
        data = bytearray(header_pages() + page)
    return bytes(data)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(_mutated(), st.lists(st.integers(0, 10_000), max_size=6))
def test_fuzz_reader_raises_only_its_error(data: bytes, cuts: list[int]) -> None:
    """Only `OggError` or valid events, whatever the bytes and however they are split."""
    _feed_all(OggReader(), _splits(data, cuts))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(st.binary(min_size=1, max_size=700), min_size=0, max_size=12),
    st.lists(st.integers(0, 100_000), max_size=10),
)
def test_round_trip_with_random_split_points(packets: list[bytes], cuts: list[int]) -> None:
    writer = OggWriter(serial=SERIAL, head=HEAD, tags=TAGS)
    stream = writer.headers() + b"".join(
        writer.write(p, 960, last=i == len(packets) - 1) for i, p in enumerate(packets)
    )
    reader = OggReader()
    events = [e for chunk in _splits(stream, cuts) for e in reader.feed(chunk)]
    assert events[:2] == [HEAD, TAGS]
    assert [e.data for e in events if isinstance(e, AudioPacket)] == packets
    granules = [e.granule for e in events if isinstance(e, AudioPacket)]
    assert granules == [312 + 960 * (i + 1) for i in range(len(packets))]
    assert reader.ended == bool(packets)
    assert reader.statistics().buffered == 0


def test_reader_takes_sphn_streams_packet_for_packet() -> None:
    """sphn: one 40 ms packet per page, two pages per 1,920 samples after the two headers."""
    writer = sphn.OpusStreamWriter(24000)
    t = np.arange(1920 * 10) / 24000
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    stream = b"".join(writer.append_pcm(pcm[i : i + 1920]) for i in range(0, len(pcm), 1920))
    reader = OggReader()
    events = []
    for at in range(0, len(stream), 97):
        events += reader.feed(stream[at : at + 97])
    assert events[0] == OpusHead(1, 1, 3840, 48_000, 0)
    assert events[1] == OpusTags(b"KyutaiMoshi", ())
    packets = [e for e in events[2:] if isinstance(e, AudioPacket)]
    assert len(packets) == len(events) - 2 == 20
    assert [p.granule for p in packets] == [1920 * (i + 1) for i in range(20)]  # no pre-skip
    assert reader.statistics().pages == 22
