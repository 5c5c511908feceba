"""Ogg pages (RFC 3533) carrying one Opus stream (RFC 7845): a sans-I/O reader and writer.

Moshi's ``/api/chat`` sends audio as binary frames ``0x01`` + Ogg/Opus bytes, 24 kHz mono,
both ways. This module only frames and unframes packets: `OggReader.feed` takes bytes split
anywhere and returns typed events; `OggWriter.write` takes one Opus packet and returns one
page. Neither does I/O nor touches a codec (`duplex.codecs._opus` does).

Page layout (RFC 3533 section 6), little-endian::

    0  "OggS"   4  version (0)   5  flags: 0x01 continued, 0x02 BOS, 0x04 EOS
    6  granule position (int64)  14 serial (u32)  18 page sequence (u32)
    22 CRC-32 (u32)  26 segment count n (u8)  27 n lacing values, then the body

A packet is the concatenation of lacing values up to and including the first one below
255; a packet whose last value is 255 continues on the next page (flag 0x01). So a page is
at most 27 + 255 + 255 * 255 = 65,307 bytes. The CRC is the direct (unreflected) CRC-32 of
polynomial 0x04C11DB7, initial value 0, no final xor, over the page with its CRC field zeroed.

The Opus mapping (RFC 7845 section 3): the first page (BOS) holds only ``OpusHead``; the
``OpusTags`` packet starts on the second page and the page where it ends holds nothing else;
both header pages carry granule 0. Audio granule positions count 48 kHz samples including
the pre-skip (section 4). Kyutai's own writer (``sphn`` 0.2.1, used by ``moshi.server`` and
``moshi.client``) writes pre-skip 3840 yet starts granules at 0 (first audio page 1920), so
the reader reports granules but never derives sample counts from them.

Reader policy, chosen for a WebSocket (reliable, ordered, message-framed):

* **No resync.** A page not starting with ``OggS``, a bad CRC, a sequence gap, a second
  serial number or a misplaced continuation raises `OggError` and poisons the reader (every
  later `feed` raises too). Resyncing (scanning for the next ``OggS``) serves damaged files
  and lossy broadcast; over TCP a broken page means a broken or hostile peer, and skipping
  would hide the bug, drop audio silently and let garbage cost a scan per byte.
* **Bounded.** Between calls the reader keeps at most one incomplete page
  (``max_page_bytes``, at most 65,307 by construction) plus one incomplete packet
  (``max_packet_bytes``); a page header announcing more is refused as soon as its segment
  table has arrived, before its body.
* **Headers required.** A stream must start with ``OpusHead`` then ``OpusTags`` (Kyutai's
  writers emit both on their first output); mapping family 0 only (mono or stereo).

Writer policy: one packet per page, each page flushed at once, as Kyutai's writer does
(``sphn``: one 40 ms packet per page, so an 80 ms model frame is two pages).
A page per packet adds 28 bytes per 40 ms but never holds a packet back waiting for a page to
fill, so the wire latency is the codec's alone.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import Final, final

from duplex.exceptions import BadAudio

__all__ = [
    "DEFAULT_MAX_PACKET_BYTES",
    "MAX_PAGE_BYTES",
    "AudioPacket",
    "EndOfStream",
    "OggError",
    "OggEvent",
    "OggReader",
    "OggReaderStatistics",
    "OggWriter",
    "OpusHead",
    "OpusTags",
    "ogg_crc32",
]

CAPTURE: Final = b"OggS"
HEADER_BYTES: Final = 27
MAX_SEGMENTS: Final = 255
MAX_BODY_BYTES: Final = MAX_SEGMENTS * 255  # 65,025
MAX_PAGE_BYTES: Final = HEADER_BYTES + MAX_SEGMENTS + MAX_BODY_BYTES  # 65,307
DEFAULT_MAX_PACKET_BYTES: Final = MAX_BODY_BYTES
"""The largest packet (audio or ``OpusTags``) the reader assembles: one full page body. RFC
6716 caps an Opus frame at 1,275 bytes and a packet at 48 frames (120 ms): 61,200 bytes."""

FLAG_CONTINUED: Final = 0x01
FLAG_BOS: Final = 0x02
FLAG_EOS: Final = 0x04

_PAGE_HEADER = struct.Struct("<4sBBqIIIB")
_OPUS_HEAD = struct.Struct("<8sBBHIhB")
OPUS_HEAD_MAGIC: Final = b"OpusHead"
OPUS_TAGS_MAGIC: Final = b"OpusTags"


class OggError(BadAudio):
    """Ogg/Opus bytes this reader refuses; wire code ``bad_audio``. The reader is then dead."""


_REVERSE_BITS: Final = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def _reverse32(value: int) -> int:
    return int.from_bytes(value.to_bytes(4, "little").translate(_REVERSE_BITS), "big")


def ogg_crc32(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """Ogg's CRC-32 (poly 0x04C11DB7, MSB first, init 0, no final xor), continuing ``crc``.

    Computed by zlib: Ogg's CRC is zlib's (the same polynomial, bit-reflected) run over
    bit-reversed bytes, bit-reversed, without zlib's initial and final inversion. A 256-entry
    table walked in Python costs more than the Opus decode of the page (docs/benchmarks.md);
    the tests check this one against such a table and a bitwise definition.
    """
    update = zlib.crc32(bytes(data).translate(_REVERSE_BITS), _reverse32(crc) ^ 0xFFFFFFFF)
    return _reverse32(update ^ 0xFFFFFFFF)


def _page_crc(page: bytes | bytearray | memoryview) -> int:
    raw = bytes(page)
    return ogg_crc32(raw[:22] + b"\x00\x00\x00\x00" + raw[26:])


# --- events -------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class OpusHead:
    """The identification header (RFC 7845 section 5.1), mapping family 0 only.

    ``pre_skip`` counts 48 kHz samples to drop from the decoder's first output;
    ``output_gain`` is Q7.8 dB; ``input_sample_rate`` is informational (0 = unknown).
    """

    version: int = 1
    channels: int = 1
    pre_skip: int = 0
    input_sample_rate: int = 24_000
    output_gain: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.version <= 15:  # the upper nibble is the major version: only 0 exists
            raise OggError(f"OpusHead version {self.version} is not 0.x (1-15)")
        if self.channels not in (1, 2):
            raise OggError(f"OpusHead mapping family 0 has 1 or 2 channels, not {self.channels}")
        if not 0 <= self.pre_skip <= 0xFFFF or not 0 <= self.input_sample_rate <= 0xFFFFFFFF:
            raise OggError("OpusHead pre-skip or input sample rate out of range")
        if not -32768 <= self.output_gain <= 32767:
            raise OggError(f"OpusHead output gain {self.output_gain} out of range")

    @classmethod
    def parse(cls, packet: bytes) -> OpusHead:
        """Validate a 19-byte family-0 ``OpusHead`` packet.

        Raises:
            OggError: wrong magic, length, version, channel count or mapping family.
        """
        if len(packet) < _OPUS_HEAD.size or not packet.startswith(OPUS_HEAD_MAGIC):
            raise OggError("the first packet is not an OpusHead")
        _, version, channels, pre_skip, rate, gain, family = _OPUS_HEAD.unpack_from(packet)
        if family != 0:
            raise OggError(f"OpusHead channel mapping family {family}: only family 0 is taken")
        if version == 1 and len(packet) != _OPUS_HEAD.size:  # later 0.x versions may grow it
            raise OggError(f"OpusHead of {len(packet)} bytes: version 1, family 0 has 19")
        return cls(version, channels, pre_skip, rate, gain)

    def to_bytes(self) -> bytes:
        """The 19-byte packet."""
        return _OPUS_HEAD.pack(
            OPUS_HEAD_MAGIC,
            self.version,
            self.channels,
            self.pre_skip,
            self.input_sample_rate,
            self.output_gain,
            0,
        )


@final
@dataclass(frozen=True, slots=True)
class OpusTags:
    """The comment header (RFC 7845 section 5.2): a vendor string and ``KEY=value`` comments.

    Strings stay bytes: RFC 7845 asks for UTF-8 but nothing here depends on it.
    """

    vendor: bytes = b"duplex"
    comments: tuple[bytes, ...] = ()

    @classmethod
    def parse(cls, packet: bytes) -> OpusTags:
        """Validate every length field against the packet.

        Raises:
            OggError: wrong magic, or a length that runs past the end of the packet.
        """
        if not packet.startswith(OPUS_TAGS_MAGIC):
            raise OggError("the second packet is not an OpusTags")
        view = memoryview(packet)
        at = 8

        def take_length() -> int:
            nonlocal at
            if at + 4 > len(view):
                raise OggError("OpusTags is truncated")
            (n,) = struct.unpack_from("<I", view, at)
            at += 4
            return n

        def take_string() -> bytes:
            nonlocal at
            n = take_length()
            if at + n > len(view):
                raise OggError("OpusTags string runs past the packet")
            at += n
            return bytes(view[at - n : at])

        vendor = take_string()
        count = take_length()
        if count > (len(view) - at) // 4:  # each comment needs at least its 4-byte length
            raise OggError(f"OpusTags claims {count} comments in {len(view) - at} bytes")
        comments = tuple(take_string() for _ in range(count))
        return cls(vendor, comments)  # trailing bytes are allowed (RFC 7845 section 5.2)

    def to_bytes(self) -> bytes:
        """The packet."""
        parts = [OPUS_TAGS_MAGIC, struct.pack("<I", len(self.vendor)), self.vendor]
        parts.append(struct.pack("<I", len(self.comments)))
        for comment in self.comments:
            parts += [struct.pack("<I", len(comment)), comment]
        return b"".join(parts)


@final
@dataclass(frozen=True, slots=True)
class AudioPacket:
    """One Opus packet. ``granule`` is its page's if it is the last packet completed on that
    page, else -1 (RFC 3533 gives granule positions to pages, not packets)."""

    data: bytes
    granule: int = -1


@final
@dataclass(frozen=True, slots=True)
class EndOfStream:
    """The EOS page arrived; further bytes are refused."""

    granule: int


OggEvent = OpusHead | OpusTags | AudioPacket | EndOfStream


@final
@dataclass(frozen=True, slots=True)
class OggReaderStatistics:
    """Counters since the reader was made; ``buffered`` is held between `feed` calls."""

    pages: int
    packets: int
    bytes_in: int
    buffered: int
    peak_buffered: int


class _Stage(enum.Enum):
    HEAD = "head"  # waiting for OpusHead on the BOS page
    TAGS = "tags"  # waiting for OpusTags, which may span pages
    AUDIO = "audio"
    ENDED = "ended"  # EOS seen
    ERROR = "error"


# --- reader -------------------------------------------------------------------------------


@final
class OggReader:
    """Bytes in, Ogg/Opus events out, for one logical stream (no chaining, no multiplexing).

    Args:
        max_packet_bytes: the largest packet assembled across pages.
        max_page_bytes: the largest page accepted, header included (at most 65,307).
    """

    def __init__(
        self,
        *,
        max_packet_bytes: int = DEFAULT_MAX_PACKET_BYTES,
        max_page_bytes: int = MAX_PAGE_BYTES,
    ) -> None:
        if max_packet_bytes < 1 or not HEADER_BYTES < max_page_bytes <= MAX_PAGE_BYTES:
            raise ValueError("max_packet_bytes >= 1 and 27 < max_page_bytes <= 65,307")
        self.max_packet_bytes = max_packet_bytes
        self.max_page_bytes = max_page_bytes
        self.head: OpusHead | None = None
        self.tags: OpusTags | None = None
        self._stage = _Stage.HEAD
        self._buffer = bytearray()
        self._partial = bytearray()  # a packet continued on the next page
        self._continued = False
        self._serial = -1
        self._sequence = -1
        self._error: OggError | None = None
        self._pages = 0
        self._packets = 0
        self._bytes_in = 0
        self._peak = 0

    @property
    def ended(self) -> bool:
        """True once the EOS page was read."""
        return self._stage is _Stage.ENDED

    def statistics(self) -> OggReaderStatistics:
        """Counters and the bytes held for an incomplete page and packet."""
        return OggReaderStatistics(
            self._pages, self._packets, self._bytes_in, self._held(), self._peak
        )

    def _held(self) -> int:
        return len(self._buffer) + len(self._partial)

    def feed(self, data: bytes | bytearray | memoryview) -> list[OggEvent]:
        """Take bytes split at any point; return the events of every page they complete.

        Raises:
            OggError: the bytes break RFC 3533/7845 or a limit, or an earlier call failed.
        """
        if self._error is not None:
            raise OggError(f"the Ogg stream failed earlier: {self._error.message}")
        self._bytes_in += len(data)
        if not data:
            return []
        events: list[OggEvent] = []
        buffer = self._buffer
        buffer += data
        at = 0
        try:
            if self._stage is _Stage.ENDED:
                self._fail("bytes after the end-of-stream page")
            while True:
                size = self._page_size(buffer, at)
                if size == 0 or at + size > len(buffer):
                    break
                self._page(memoryview(buffer)[at : at + size], events)
                at += size
        except OggError as exc:
            self._stage = _Stage.ERROR
            self._error = exc
            self._buffer = bytearray()
            self._partial = bytearray()
            raise
        del buffer[:at]
        self._peak = max(self._peak, self._held())
        return events

    def _fail(self, message: str) -> None:
        raise OggError(message)

    def _page_size(self, buffer: bytearray, at: int) -> int:
        """The size of the page starting at ``at``, or 0 while its header is incomplete."""
        have = len(buffer) - at
        if buffer[at : at + 4] != CAPTURE[: min(4, have)]:
            self._fail("a page does not start with the capture pattern OggS (no resync)")
        if have < HEADER_BYTES:
            return 0
        nsegs = buffer[at + 26]
        if have < HEADER_BYTES + nsegs:
            # the whole table is needed for the size; check the header's own fields early
            self._check_version(buffer, at)
            return 0
        body = sum(buffer[at + HEADER_BYTES : at + HEADER_BYTES + nsegs])
        size = HEADER_BYTES + nsegs + body
        if size > self.max_page_bytes:
            self._fail(f"a page of {size} bytes is over the limit of {self.max_page_bytes}")
        self._check_version(buffer, at)
        return size

    def _check_version(self, buffer: bytearray, at: int) -> None:
        if buffer[at + 4] != 0:
            self._fail(f"Ogg page version {buffer[at + 4]}: only version 0 exists")
        if buffer[at + 5] & ~(FLAG_CONTINUED | FLAG_BOS | FLAG_EOS):
            self._fail(f"Ogg page flags {buffer[at + 5]:#04x} set undefined bits")

    def _page(self, page: memoryview, events: list[OggEvent]) -> None:
        _, _, flags, granule, serial, sequence, crc, nsegs = _PAGE_HEADER.unpack_from(page)
        if _page_crc(page) != crc:
            self._fail(f"page {sequence} fails its CRC check")
        if self._serial < 0:
            if not flags & FLAG_BOS:
                self._fail("the first page is not a beginning-of-stream page")
            self._serial = serial
        elif flags & FLAG_BOS:
            self._fail("a second beginning-of-stream page (chained or multiplexed streams)")
        elif serial != self._serial:
            self._fail(f"page of serial {serial:#x} in stream {self._serial:#x}")
        elif sequence != (self._sequence + 1) & 0xFFFFFFFF:
            self._fail(f"page {sequence} follows page {self._sequence}: a page is missing")
        self._sequence = sequence
        self._pages += 1
        if bool(flags & FLAG_CONTINUED) != self._continued:
            self._fail(
                "a continued page with no packet to continue"
                if self._continued is False
                else "a packet left unfinished by the previous page"
            )
        lacing = page[HEADER_BYTES : HEADER_BYTES + nsegs]
        at = HEADER_BYTES + nsegs
        completed: list[bytes] = []
        start = at
        for value in lacing:
            at += value
            if value < 255:
                if self._partial:
                    self._grow(at - start)
                    self._partial += page[start:at]
                    completed.append(bytes(self._partial))
                    self._partial = bytearray()
                else:
                    self._check_packet_size(at - start)
                    completed.append(bytes(page[start:at]))
                start = at
        if start < at:  # the last packet goes on to the next page
            self._grow(at - start)
            self._partial += page[start:at]
        if nsegs:  # a page without segments continues nothing and ends nothing
            self._continued = lacing[-1] == 255
        self._packets += len(completed)
        self._opus(completed, flags, granule, events)

    def _grow(self, more: int) -> None:
        self._check_packet_size(len(self._partial) + more)

    def _check_packet_size(self, size: int) -> None:
        if size > self.max_packet_bytes:
            self._fail(f"a packet of over {size - 1} bytes: the limit is {self.max_packet_bytes}")

    def _opus(self, packets: list[bytes], flags: int, granule: int, events: list[OggEvent]) -> None:
        stage = self._stage
        if stage is _Stage.HEAD:
            if len(packets) != 1 or self._continued:
                self._fail("the BOS page must hold the OpusHead packet alone")
            self.head = OpusHead.parse(packets[0])
            events.append(self.head)
            self._header_granule(granule)
            self._stage = _Stage.TAGS
            packets = []
        elif stage is _Stage.TAGS and packets:
            if len(packets) != 1 or self._continued:
                self._fail("the page where OpusTags ends must hold no other packet")
            self.tags = OpusTags.parse(packets[0])
            events.append(self.tags)
            self._header_granule(granule)
            self._stage = _Stage.AUDIO
            packets = []
        elif stage is _Stage.TAGS and granule not in (0, -1):
            self._fail("an OpusTags page has a granule position other than 0")
        last = len(packets) - 1
        for index, packet in enumerate(packets):
            if not packet:
                self._fail("an empty Opus packet (RFC 6716 packets have at least one byte)")
            events.append(AudioPacket(packet, granule if index == last else -1))
        if flags & FLAG_EOS:
            if self._continued:
                self._fail("the end-of-stream page leaves a packet unfinished")
            self._stage = _Stage.ENDED
            events.append(EndOfStream(granule))

    def _header_granule(self, granule: int) -> None:
        if granule != 0:
            self._fail(f"an Opus header page has granule position {granule}, not 0")


# --- writer -------------------------------------------------------------------------------


@final
class OggWriter:
    """Packets in, pages out: ``OpusHead`` and ``OpusTags`` pages first, then one page per packet.

    Args:
        serial: the stream's serial number (RFC 3533 asks for a random one per stream).
        head: the identification header; its ``pre_skip`` starts the granule count.
        tags: the comment header.
    """

    def __init__(self, *, serial: int, head: OpusHead, tags: OpusTags | None = None) -> None:
        if not 0 <= serial <= 0xFFFFFFFF:
            raise ValueError(f"serial {serial} is not a u32")
        self.serial = serial
        self.head = head
        self.tags = tags if tags is not None else OpusTags()
        self._tags = self.tags.to_bytes()
        if len(self._tags) >= MAX_BODY_BYTES:
            raise ValueError("OpusTags must fit one page (65,024 bytes)")
        self._sequence = 0
        self._granule = head.pre_skip
        self._started = False
        self._ended = False

    @property
    def granule(self) -> int:
        """The granule position of the last page written (48 kHz samples, pre-skip included)."""
        return self._granule

    @property
    def ended(self) -> bool:
        """True once a page with the EOS flag was written."""
        return self._ended

    def headers(self) -> bytes:
        """The two header pages; written once, before the first audio page."""
        if self._started:
            return b""
        self._started = True
        return self._page(self.head.to_bytes(), FLAG_BOS, 0) + self._page(self._tags, 0, 0)

    def write(self, packet: bytes, samples_48k: int, *, last: bool = False) -> bytes:
        """One page holding ``packet``, preceded by the header pages on the first call.

        Args:
            packet: one Opus packet (1 to 65,024 bytes).
            samples_48k: its duration in 48 kHz samples; the page's granule grows by it.
            last: set the EOS flag; the writer then refuses more packets.
        """
        if self._ended:
            raise ValueError("the stream already ended")
        if not 0 < len(packet) < MAX_BODY_BYTES or samples_48k < 0:
            raise ValueError(f"a packet of {len(packet)} bytes does not fit one page")
        prefix = self.headers()
        self._granule += samples_48k
        self._ended = last
        return prefix + self._page(packet, FLAG_EOS if last else 0, self._granule)

    def _page(self, body: bytes, flags: int, granule: int) -> bytes:
        full, rest = divmod(len(body), 255)
        lacing = b"\xff" * full + bytes((rest,))
        header = _PAGE_HEADER.pack(
            CAPTURE, 0, flags, granule, self.serial, self._sequence, 0, len(lacing)
        )
        page = bytearray(header + lacing + body)
        struct.pack_into("<I", page, 22, _page_crc(page))
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        return bytes(page)
