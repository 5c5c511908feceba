"""Raw WebSocket client frames for tests that must send what no client library would."""

from __future__ import annotations

import os
import struct


def masked_frame(opcode: int, payload: bytes, *, rsv1: bool = False, fin: bool = True) -> bytes:
    """One masked client frame."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        header = bytes([first, 0x80 | n])
    elif n < 1 << 16:
        header = bytes([first, 0x80 | 126]) + struct.pack(">H", n)
    else:
        header = bytes([first, 0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)
    repeated = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")
    return header + mask + masked
