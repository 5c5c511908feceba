"""The kernels' inline PTX, run on the CPU by a small interpreter of the instructions it uses.

Triton's interpreter cannot run inline assembly, so on a host without a GPU the kernels
take integer operations instead (`_levels`, `_pair_levels`, `_raw_levels`,
`_fp8_word_values`). These tests run each PTX block on random words, instruction by
instruction as the PTX ISA defines them, and check that it gives what those integer
operations give, element by element in the order Triton packs them: a typo in a byte
selector or a mask fails here, not only on a GPU.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import numpy as np
import pytest
import torch

from duplex.kernels import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

WORDS = 4096


def _f16(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint16).view(np.float16)


def _bits(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint16).astype(np.uint32)


def _halves(word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _f16(word & 0xFFFF), _f16(word >> 16)


def _join(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return _bits(low) | (_bits(high) << 16)


def _prmt(a: np.ndarray, b: np.ndarray, selector: int) -> np.ndarray:
    """``prmt.b32`` in its default mode: byte ``i`` of the result is byte ``s_i`` of the
    eight bytes of ``{b, a}`` (``a`` bytes 0-3), ``s_i`` the selector's nibble ``i``
    (its sign bit set would replicate that byte's sign; the kernels never set it)."""
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        assert nibble < 8, "sign replication is not used by the kernels"
        source = a if nibble < 4 else b
        out |= ((source >> (8 * (nibble % 4))) & 0xFF) << (8 * i)
    return out


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    """``lop3.b32``: each result bit is bit ``4a + 2b + c`` of the table ``lut`` (so the
    table of ``f`` is ``f(0xF0, 0xCC, 0xAA)``)."""
    out = np.zeros_like(a)
    for index in range(8):
        if lut >> index & 1:
            pick = np.full_like(a, 0xFFFFFFFF)
            for operand, bit in ((a, 4), (b, 2), (c, 1)):
                pick &= operand if index & bit else ~operand
            out |= pick
    return out


def test_lop3_table_is_its_function_of_the_three_bytes() -> None:
    """The model itself: ``(a & b) | c`` is table 0xEA."""
    a, b, c = (np.array([x], dtype=np.uint32) for x in (0xF0, 0xCC, 0xAA))
    assert int(_lop3(a, b, c, 0xEA)[0]) == (0xF0 & 0xCC) | 0xAA == 0xEA


def _e4m3x2(word16: np.ndarray) -> np.ndarray:
    """``cvt.rn.f16x2.e4m3x2``: the low byte's value to the low half (exact in float16)."""
    low = torch.from_numpy((word16 & 0xFF).astype(np.uint8)).view(torch.float8_e4m3fn)
    high = torch.from_numpy((word16 >> 8).astype(np.uint8)).view(torch.float8_e4m3fn)
    return _join(low.to(torch.float16).numpy(), high.to(torch.float16).numpy())


def run_ptx(source: str, inputs: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``source`` on ``inputs`` (``$N`` -> uint32 words); every register after it."""
    regs: dict[str, np.ndarray] = {f"${n}": v.astype(np.uint32) for n, v in inputs.items()}

    def value(token: str) -> np.ndarray:
        token = token.strip()
        if token in regs:
            return regs[token]
        return np.full(WORDS, int(token, 0), dtype=np.uint32)

    for line in source.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):
            names, word = re.fullmatch(r"\{(.+)\},\s*(\S+)", rest).groups()
            low, high = (n.strip() for n in names.split(","))
            regs[low], regs[high] = value(word) & 0xFFFF, value(word) >> 16
            continue
        dest, *args = (a.strip() for a in rest.split(","))
        if op == "mov.b32":
            regs[dest] = value(args[0])
        elif op == "prmt.b32":
            regs[dest] = _prmt(value(args[0]), value(args[1]), int(args[2], 0))
        elif op == "and.b32":
            regs[dest] = value(args[0]) & value(args[1])
        elif op == "shr.b32":  # logical: .b32 is untyped
            regs[dest] = value(args[0]) >> int(args[1], 0)
        elif op == "lop3.b32":
            regs[dest] = _lop3(value(args[0]), value(args[1]), value(args[2]), int(args[3], 0))
        elif op == "sub.f16x2":
            (a0, a1), (b0, b1) = _halves(value(args[0])), _halves(value(args[1]))
            regs[dest] = _join(a0 - b0, a1 - b1)  # one rounding, as the instruction's
        elif op == "fma.rn.f16x2":
            halves = [_halves(value(a)) for a in args]
            fused = [
                (x.astype(np.float64) * y.astype(np.float64) + z.astype(np.float64))
                for x, y, z in zip(*halves, strict=True)
            ]
            regs[dest] = _join(*fused)
        elif op == "dp4a.u32.s32":  # four unsigned bytes of a by four signed of b, plus c
            a, b = value(args[0]), value(args[1])
            total = value(args[2]).view(np.int32).astype(np.int64)
            for i in range(4):
                signed = ((b >> (8 * i)) & 0xFF).astype(np.int64)
                total += ((a >> (8 * i)) & 0xFF).astype(np.int64) * (signed - 256 * (signed >> 7))
            regs[dest] = (total & 0xFFFFFFFF).astype(np.uint32)
        elif op == "cvt.rn.f16x2.e4m3x2":
            regs[dest] = _e4m3x2(value(args[0]))
        else:
            raise AssertionError(f"instruction not modelled here: {op}")
    return regs


def _module(name: str) -> ModuleType:
    """A kernels module (the package re-exports functions under the same names)."""
    return importlib.import_module(f"duplex.kernels.{name}")


def _random_words(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, WORDS, dtype=np.uint64).astype(np.uint32)


def _bytes_of(words: np.ndarray) -> list[np.ndarray]:
    return [(words >> (8 * i)) & 0xFF for i in range(4)]


@pytest.mark.parametrize("raw", [False, True], ids=["levels", "raw-levels"])
def test_byte_unpack_gives_each_nibbles_level_in_order(raw: bool) -> None:
    """Four bytes (pack 4): outputs ``$0 $1`` are the low nibbles of bytes 0-3, ``$2 $3``
    the high ones; as levels ``n - 8``, or raw as ``1024 + n`` and ``1024 + 16 n``."""
    kv_int4 = _module("kv_int4")
    source = (kv_int4._UNPACK_RAW_ASM if raw else kv_int4._UNPACK_ASM).value
    words = _random_words(1)
    regs = run_ptx(source, {4: words})
    low = [*_halves(regs["$0"]), *_halves(regs["$1"])]
    high = [*_halves(regs["$2"]), *_halves(regs["$3"])]
    for byte, got_low, got_high in zip(_bytes_of(words), low, high, strict=True):
        want_low = (byte & 15) + 1024 if raw else (byte & 15).astype(np.int64) - 8
        want_high = (byte >> 4) * 16 + 1024 if raw else (byte >> 4).astype(np.int64) - 8
        np.testing.assert_array_equal(got_low.astype(np.int64), want_low)
        np.testing.assert_array_equal(got_high.astype(np.int64), want_high)


@pytest.mark.parametrize("raw", [False, True], ids=["levels", "raw-levels"])
def test_word_unpack_gives_each_words_four_levels(raw: bool) -> None:
    """Two 16-bit words (pack 2): output ``$c`` holds value ``c`` of word 0 (low half) and
    of word 1 (high half), value ``c`` being nibble ``c`` of the word, low first; as levels
    ``n - 8``, or raw as ``1024 + n`` (``c`` even) and ``1024 + 16 n`` (odd)."""
    kv_int4 = _module("kv_int4")
    source = (kv_int4._UNPACK_PAIR_RAW_ASM if raw else kv_int4._UNPACK_PAIR_ASM).value
    words = _random_words(2)
    regs = run_ptx(source, {4: words})
    for c in range(4):
        first, second = _halves(regs[f"${c}"])
        for got, word in ((first, words & 0xFFFF), (second, words >> 16)):
            nibble = ((word >> (4 * c)) & 15).astype(np.int64)
            want = (1024 + nibble * (16 if c % 2 else 1)) if raw else nibble - 8
            np.testing.assert_array_equal(got.astype(np.int64), want)


def test_subnormal_unpack_gives_each_words_four_nibbles_scaled() -> None:
    """Two 16-bit words (pack 2): output ``$c`` holds nibble ``c`` of word 0 (low half) and
    of word 1 (high half) as a float16 subnormal, ``n 2**-24`` for ``c`` even and ``16 n
    2**-24`` for ``c`` odd, as `_pair_subnormals`' integer form makes them."""
    source = _module("kv_int4")._PAIR_SUBNORMAL_ASM.value
    words = _random_words(7)
    regs = run_ptx(source, {4: words})
    for c in range(4):
        first, second = _halves(regs[f"${c}"])
        for got, word in ((first, words & 0xFFFF), (second, words >> 16)):
            nibble = ((word >> (4 * c)) & 15).astype(np.float64)
            want = nibble * (16 if c % 2 else 1) * 2.0**-24
            np.testing.assert_array_equal(got.astype(np.float64), want)


def test_dp4a_products_sum_each_words_nibbles_times_the_query_bytes() -> None:
    """A 32-bit key word (pack 1) and two words of signed query bytes: ``$0`` is the sum of
    the word's eight nibbles ``n`` (byte ``k``'s low nibble by byte ``k`` of ``$2``, its
    high nibble by byte ``k`` of ``$3``), as `_dp4a_nibbles`' integer form computes it."""
    source = _module("kv_int4")._DP4A_ASM.value
    words, q_lo, q_hi = _random_words(4), _random_words(5), _random_words(6)
    regs = run_ptx(source, {1: words, 2: q_lo, 3: q_hi})
    want = np.zeros(WORDS, dtype=np.int64)
    for k, (byte, lo, hi) in enumerate(zip(*map(_bytes_of, (words, q_lo, q_hi)), strict=True)):
        assert k < 4
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
        want += (byte & 15).astype(np.int64) * np.where(lo > 127, lo - 256, lo)
        want += (byte >> 4).astype(np.int64) * np.where(hi > 127, hi - 256, hi)
    np.testing.assert_array_equal(regs["$0"].view(np.int32).astype(np.int64), want)


def test_fp8_word_unpack_gives_each_words_two_values() -> None:
    """Two 16-bit words (pack 2) of two e4m3 bytes: ``$0`` holds each word's low byte's
    value, ``$1`` its high byte's, word 0 in the low half."""
    source = _module("ring_attention")._FP8_WORDS_ASM.value
    words = _random_words(3)
    regs = run_ptx(source, {2: words})
    for position, out in ((0, "$0"), (1, "$1")):
        first, second = _halves(regs[out])
        for got, word in ((first, words & 0xFFFF), (second, words >> 16)):
            byte = torch.from_numpy(((word >> (8 * position)) & 0xFF).astype(np.uint8))
            want = byte.view(torch.float8_e4m3fn).to(torch.float16).numpy()
            np.testing.assert_array_equal(got, want)  # NaN bytes: NaN in both
