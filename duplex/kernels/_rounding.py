"""Float32 rounded to a narrower format's nearest value, ties to even, on the bits.

Why not the cast alone: Triton's interpreter (the CPU tests) truncates a float32 cast to
bfloat16 and rounds a carry into the next binade to half of it in a cast to e4m3 (-124.4 to
-64), so kernels that must give torch's bits round first and then cast exactly. Compiled,
these are a few integer instructions a value.
"""

from __future__ import annotations

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

__all__: list[str] = []  # Triton helpers: imported by name by the kernel modules

if _triton.available():

    @triton.jit
    def bf16_nearest_even(x):
        """Finite ``x`` rounded to the nearest bfloat16 value, as float32 (overflow gives
        inf, as torch's cast): bfloat16 keeps float32's top 16 bits."""
        bits = x.to(tl.int32, bitcast=True)
        kept = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000  # ~0xFFFF
        return kept.to(tl.float32, bitcast=True)

    @triton.jit
    def e4m3_nearest_even(x):
        """``x`` (``|x| <= 448``) rounded to the nearest e4m3 value, ties to even, as float32.
        Normal e4m3 values keep 3 of float32's 23 mantissa bits (the rounding done on the
        bits, whose carry reaches the exponent); below 2**-6 e4m3 steps by 2**-9, which
        adding 1.5 * 2**14 leaves as float32's last bit."""
        bits = x.to(tl.int32, bitcast=True)
        kept = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # ~0xFFFFF
        normal = kept.to(tl.float32, bitcast=True)
        small = tl.abs((x + 24576.0) - 24576.0).to(tl.int32, bitcast=True)
        # x's sign put back on the bits (-0.0 where a negative value rounds to 0): compiled,
        # Triton's ``-small`` is ``0 - small``, which gives +0.0
        small = (small | (bits & -2147483648)).to(tl.float32, bitcast=True)
        return tl.where(tl.abs(x) < 0.015625, small, normal)
