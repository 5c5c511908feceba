"""Ogg pages built by hand for the codec tests, with a CRC written independently of duplex's."""

from __future__ import annotations

import struct

SERIAL = 0x1234ABCD


def bitwise_crc(data: bytes) -> int:
    """Ogg's CRC-32 one bit at a time: poly 0x04C11DB7, MSB first, init 0, no final xor."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else crc << 1
    return crc


def _table() -> list[int]:
    out = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else crc << 1
        out.append(crc)
    return out


_TABLE = _table()


def table_crc(data: bytes) -> int:
    """The same CRC through a 256-entry table, a byte at a time."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[(crc >> 24) ^ byte]
    return crc


def raw_page(
    lacing: list[int],
    body: bytes,
    *,
    flags: int = 0,
    seq: int = 0,
    granule: int = 0,
    serial: int = SERIAL,
    version: int = 0,
    crc: int | None = None,
) -> bytes:
    """A page from its parts, its CRC computed bitwise unless given."""
    header = struct.pack(
        "<4sBBqIIIB", b"OggS", version, flags, granule, serial, seq, 0, len(lacing)
    )
    page = bytearray(header + bytes(lacing) + body)
    struct.pack_into("<I", page, 22, bitwise_crc(bytes(page)) if crc is None else crc)
    return bytes(page)


def lacing_of(size: int) -> list[int]:
    return [255] * (size // 255) + [size % 255]
