"""KV rows in 4 bits, and the ring decode attention that reads them in place.

Storage: each row of ``D`` values is cut into groups of `GROUP` values; a group
keeps one scale (float16, its largest magnitude / 7) and its values as signed
4-bit integers in ``[-8, 7]``, two to a byte (value ``2j`` in the low nibble of
byte ``j``, value ``2j + 1`` in the high one, each stored plus 8). A row of
``D = 128`` takes 64 bytes of values and 8 of scales: 72 bytes, against 128 in
fp8 and 256 in bf16. Rounding is to the nearest level; a group of zeros has
scale 0 and dequantizes to zeros.

`quantize_int4` / `dequantize_int4` are the torch reference (and the path off
CUDA). `ring_attention_int4` is `ring_attention` (``ring_attention.py``) for
such rings: one program per (row, head, split) walks its split's filled rows,
loads the packed bytes and the scales and unpacks the nibbles in registers, so
nothing is widened in memory; the splits are merged by the same kernel as the
other dtypes. Every int4 read takes the query rounded to 8 bits a group
(`round_query`): on a GPU the keys' products are then 8-bit integer dot products
(``dp4a``: eight stored nibbles by eight query bytes in two instructions, summed
exactly) and the values' product runs on tensor cores (`_ring_attention_int4`
with ``DOT``, its nibbles unpacked by inline PTX); its elementwise form serves
head rows too narrow for a tensor-core tile. The read is bound by the
instructions a key row costs, not by its bytes, where the card's bandwidth is
high for its SMs (docs/benchmarks.md, "The keys' products in 8-bit integers";
counted by ``bench/kernel_sass.py``). ``ring_attention_int4_reference``
dequantizes the filled rows and calls `ring_attention_reference` with the
rounded query.

Why PTX by hand: Triton makes each 4-bit value a float with its own instructions
(a mask, a shift, a conversion); the PTX unpacks two values an instruction, as
the int4 matrix kernels of the GPU libraries do, and no library exposes that for
a ring laid out as this one is.
"""

from __future__ import annotations

import math

import torch

from . import _triton
from .ring_attention import merge_splits, ring_attention_reference, rows_on_even_bytes

if _triton.available():
    import triton
    import triton.language as tl

__all__ = [
    "BLOCK_ROWS",
    "GROUP",
    "KEY_WORDS",
    "MAX_REGISTERS",
    "NUM_STAGES",
    "NUM_WARPS",
    "SPLIT_ROWS",
    "ZERO_BYTE",
    "dequantize_int4",
    "int4_row_bytes",
    "quantize_int4",
    "ring_attention_int4",
    "ring_attention_int4_reference",
    "write_int4_rows",
]

GROUP = 32
"""Values per scale: 4 scales a 128-value head row."""
ZERO_BYTE = 0x88
"""Two zeros (level 0 is stored as 8 in each nibble): a cleared ring's bytes."""
SPLIT_ROWS = 1024
"""Rows a program walks (a split, merged after). With `BLOCK_ROWS`, `NUM_WARPS`,
`MAX_REGISTERS` and `KEY_WORDS`, the fastest tiling timed on an H100 at B=128
(docs/benchmarks.md, "The int4 read timed: words for keys, 128-row tiles"): 1024-row splits
0.96x the full read's time of 512-row ones, 2048-row ones no faster."""
BLOCK_ROWS = 128
"""Rows per tile of the online softmax: a tile's query operands and softmax bookkeeping are
paid once per 128 rows (749 loop instructions a key row against 856 at 64, by
``bench/kernel_sass.py``)."""
NUM_WARPS = 4
"""Warps a program (8 warps of 128-row tiles read 1.8-2.1x slower)."""
MAX_REGISTERS = 128
"""A thread's registers at most (ptxas's ``maxnreg``; 0 uncapped): 128-row tiles at 168
registers were 1.00-1.02x the time, uncapped 1.00-1.03x (B=128 on an H100, ``--reps 50``;
docs/benchmarks.md, "The shipped read on the GPU, its register cap")."""
NUM_STAGES = 3
"""Software-pipeline stages of the tile loop."""
KEY_WORDS = True
"""`ring_attention_int4`'s ``key_words`` when not given. With 128-row tiles and 1024-row
splits at 128 registers: 0.68x the full read's time of 64-row tiles of 512-row splits at 96
registers with key bytes (B=128 on an H100; docs/benchmarks.md, "The int4 read timed: words
for keys, 128-row tiles")."""
KEY_DP4A = True
"""`ring_attention_int4`'s ``key_dp4a`` when not given: the keys' products as 8-bit integer
dot products (`_DP4A_ASM`) with the key scales loaded as one word a row, 0.81x the loop's
instructions of `KEY_WORDS`' tensor-core form by ``bench/kernel_sass.py`` (607 against 749 a
key row); on an H100 0.96x its time at B=128 staggered, 1.00x full (bound by the bytes)."""
VALUE_SUBNORMALS = True
"""`ring_attention_int4`'s ``value_subnormals`` when not given: the values' nibbles made
float16 subnormals by a mask each (`_PAIR_SUBNORMAL_ASM`), their offsets taken off once at
the end: with `KEY_DP4A` and `ROW_MIX`, 530 loop instructions a key row against 593
(``bench/kernel_sass.py``); on an H100 (bound by its bytes there) the same time, 1.00x at
B=128 full and 1.02x staggered (docs/benchmarks.md, "The keys' products in 8-bit integers")."""
ROW_MIX = True
"""`ring_attention_int4`'s ``row_mix`` when not given (with `KEY_DP4A` only): the values'
weights (a row's softmax weight times its group's scale) computed on ``[rows, groups]``,
then laid out as the product's ``[16, rows]`` operand, not computed on that operand's 16 rows
of which 12 are zeros: 593 loop instructions a key row against 607, the same time on an
H100."""
WHOLE_TILES = True
"""`ring_attention_int4`'s ``whole_tiles`` when not given: a split's whole tiles are read by
a loop without masks and its last, partial tile (if any) by a second one with them: 484 loop
instructions a key row against 530 (``bench/kernel_sass.py``); the cost is the tail loop's
code, not its time (at most one tile a split)."""
QUERY_LEVELS = 127
"""The query's levels each side of zero: it is rounded to 8 bits a group for the keys'
products (`round_query`)."""
_LEVELS = 7.0


def int4_row_bytes(head_dim: int, group: int = GROUP) -> float:
    """Bytes one stored row of ``head_dim`` values takes (packed values and scales)."""
    return head_dim / 2 + 2 * head_dim / group


def quantize_int4(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (``[..., D]``, any float dtype) as ``(packed uint8 [..., D/2], scales float16
    [..., D/group])``; ``D`` a multiple of ``group``, ``group`` even."""
    *lead, dim = x.shape
    if dim % group or group % 2:
        raise ValueError(f"head_dim {dim} must be a multiple of an even group ({group})")
    groups = x.float().reshape(*lead, dim // group, group)
    scale = groups.abs().amax(dim=-1, keepdim=True).div_(_LEVELS).to(torch.float16).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    levels = torch.where(scale > 0, groups / safe, torch.zeros_like(groups))
    levels = levels.round_().clamp_(-8, 7).add_(8).to(torch.uint8).reshape(*lead, dim)
    packed = levels[..., 0::2] | (levels[..., 1::2] << 4)
    return packed, scale.squeeze(-1).to(torch.float16)


def dequantize_int4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    group: int = GROUP,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The values `quantize_int4` stored, ``[..., D]`` in ``dtype``."""
    low = (packed & 15).to(torch.int16) - 8
    high = (packed >> 4).to(torch.int16) - 8
    levels = torch.stack([low, high], dim=-1).flatten(-2).float()  # [..., D]
    scale = scales.float().repeat_interleave(group, dim=-1)
    return (levels * scale).to(dtype)


def round_query(q: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """The query an int4 read multiplies the keys by, float32: each group of ``group``
    values rounded to an integer level in ``[-127, 127]`` times the group's largest magnitude
    / 127 (`QUERY_LEVELS`), ties to even.

    Why: the keys' products are then integer dot products, four 4-bit keys by four 8-bit
    query values an instruction (``dp4a``), summed exactly in 32 bits. Each read (the kernel
    in every form, the reference, the CPU path) rounds so, so they agree; the rounding's
    error is a 254th of the group's largest value, against a 14th of the key's group's for
    the key's own rounding (its cost, measured: docs/benchmarks.md, "The keys' products in
    8-bit integers")."""
    *lead, dim = q.shape
    if dim % group:
        raise ValueError(f"head_dim {dim} must be a multiple of group ({group})")
    groups = q.float().reshape(*lead, dim // group, group)
    top = groups.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(top > 0, QUERY_LEVELS / top, torch.zeros_like(top))
    levels = torch.round(groups * inverse)
    return (levels * (top / QUERY_LEVELS)).reshape(*lead, dim)


def write_int4_rows(
    rings: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    new: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
    rows: torch.Tensor,
    active: torch.Tensor | None = None,
    group: int = GROUP,
) -> None:
    """Quantize the keys and values ``new`` (each ``[B, H, D]``) as `quantize_int4` does and
    store each at row ``rows[b]`` of slot ``slots[b]`` of its ring in ``rings`` (``(packed
    [slots, H, context, D/2], scales [slots, H, context, D/group])``, one layer's); rows
    where ``active`` is False are left as they were. Bit for bit what `quantize_int4` and an
    indexed store give.

    Why a kernel: in torch the quantizer and the stores are about twenty launches a ring and
    a layer (an absolute value, a max, a division, a rounding, a clamp, the packing, two
    indexed stores, and the gathers that keep inactive rows), some 1,300 of a 7B step's 5,200
    kernels; here they are one launch a layer for keys and values together. Its divisions are
    IEEE ones (``div_rn``), as torch's: Triton's ``/`` on float32 is the approximate
    ``div.full``."""
    (k_packed, k_scales), (v_packed, v_scales) = rings
    k, v = new
    batch, heads, dim = k.shape
    if dim % group or group % 2 or (dim // 2) & (dim // 2 - 1):
        raise ValueError(f"head_dim {dim} must be a power of two and a multiple of {group}")
    k, v = k.contiguous(), v.contiguous()
    if active is None:
        active = torch.ones(batch, dtype=torch.bool, device=k.device)
    _write_int4_rows[(batch, heads)](
        k,
        v,
        k_packed,
        k_scales,
        v_packed,
        v_scales,
        slots.contiguous(),
        rows.contiguous(),
        active.to(torch.int32),
        k.stride(0),
        k.stride(1),
        *k_packed.stride()[:3],
        *k_scales.stride()[:3],
        *v_packed.stride()[:3],
        *v_scales.stride()[:3],
        HALF=dim // 2,
        GROUP=group,
        num_warps=1,
    )


def ring_attention_int4_reference(
    q: torch.Tensor,
    keys: tuple[torch.Tensor, torch.Tensor],
    values: tuple[torch.Tensor, torch.Tensor],
    lengths: torch.Tensor,
    slots: torch.Tensor | None = None,
    max_len: int | None = None,
    group: int = GROUP,
) -> torch.Tensor:
    """`ring_attention_reference` over int4 rings: ``keys`` and ``values`` are each
    ``(packed [slots, H, context, D/2], scales [slots, H, context, D/group])``; only the
    rows read are dequantized."""
    if slots is None:
        slots = torch.arange(q.shape[0], device=q.device)
    rows = keys[0].shape[2] if max_len is None else max_len
    k = dequantize_int4(keys[0][slots, :, :rows], keys[1][slots, :, :rows], group)
    v = dequantize_int4(values[0][slots, :, :rows], values[1][slots, :, :rows], group)
    out = ring_attention_reference(round_query(q, group), k, v, lengths, None, rows)
    return out.to(q.dtype)


def _value_words_fit(packed: torch.Tensor, head_dim: int, group: int) -> bool:
    """Whether the tensor-core form can read the packed values as 16-bit words of four
    values: every row starts on an even byte, a word never spans two groups, and a row's
    words are at least the 16 columns a product needs."""
    return rows_on_even_bytes(packed) and group % 4 == 0 and head_dim // 4 >= 16


def _dp4a_fits(packed: torch.Tensor, head_dim: int, group: int) -> bool:
    """Whether the keys can be read as 32-bit words of eight values: every row starts on a
    multiple of 4 bytes, a word never spans two groups, and a row's and a group's words are
    powers of two (a tile's shapes)."""
    words, group_words = head_dim // 8, group // 8
    return (
        group % 8 == 0
        and words & (words - 1) == 0
        and group_words & (group_words - 1) == 0
        and packed.data_ptr() % 4 == 0
        and all(st % 4 == 0 for st in packed.stride()[:-1])
    )


def _scale_word_bits(*scales: torch.Tensor) -> int:
    """The width of one row's float16 scales where it is a word (16, 32 or 64 bits) and
    every row of ``scales`` starts on a multiple of it; else 0 (loaded one by one)."""
    groups = scales[0].shape[-1]
    bits = 16 * groups
    if bits not in (16, 32, 64) or any(s.stride(-2) != groups for s in scales):
        return 0
    for s in scales:
        if s.data_ptr() % (bits // 8) or any(st % groups for st in s.stride()[:-2]):
            return 0
    return bits


def ring_attention_int4(
    q: torch.Tensor,
    keys: tuple[torch.Tensor, torch.Tensor],
    values: tuple[torch.Tensor, torch.Tensor],
    lengths: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    group: int = GROUP,
    split_rows: int | None = None,
    block_rows: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    dot: bool | None = None,
    max_registers: int | None = None,
    key_words: bool | None = None,
    key_dp4a: bool | None = None,
    value_subnormals: bool | None = None,
    row_mix: bool | None = None,
    whole_tiles: bool | None = None,
) -> torch.Tensor:
    """`ring_attention_int4_reference` as a Triton kernel (CUDA; interpreted for host
    tensors). The packed rings and their scales may be strided views of a larger pool as
    long as their last axes are contiguous; ``lengths`` in ``[1, context]``.

    It loads each row's scales once and applies them per group (the key's dot is summed
    within a group, then scaled; the value weights are the row weight times the group's
    scale), and makes each nibble's level a float by placing it in a float's mantissa (no
    int-to-float conversion, a quarter-rate instruction). The first kernel, which converted
    and scaled every value as it unpacked it, read a third slower at best (commit
    ``d019c80``; docs/benchmarks.md, "KV in 4 bits on a GPU").

    ``dot`` puts both products on tensor cores (the kernel's ``DOT`` form); None means on
    CUDA where the shapes allow it (a half row and a tile of at least 16). Off CUDA the
    dot form runs in float32 with the nibbles unpacked by Triton operations, as Triton's
    interpreter has neither 16-bit ``tl.dot`` nor inline assembly. The tensor-core form loads
    each row's scales as one word where the layout allows (`_scale_word_bits`; else one by
    one): a quarter of its instructions fewer, and 0.77x the time at the same tiling on an
    H200 (docs/benchmarks.md, "Where the kernel's time goes"). It reads the values as 16-bit
    words of four where the layout allows (`_value_words_fit`; else byte by byte), one
    product per position in the word, and takes the keys' level offsets off the sums
    instead of each value: 0.72x its instructions a key row by ``bench/kernel_sass.py``,
    0.95x the time on an H100 at B=128 (docs/benchmarks.md, "Values as words, and Mimi's
    rings read in place").

    Arguments left None take the module's defaults at each call (`SPLIT_ROWS` ...
    `KEY_WORDS`: a bench sets them for a whole run). ``max_registers`` 0 is uncapped; it caps
    a thread's registers (ptxas's ``maxnreg``): fewer a thread, more
    programs an SM, and so more tiles loading at once (`bench/kernel_sass.py` counts what a
    cap costs in instructions and spills).

    The values keep their levels (``n - 8``): left raw as the keys are (``1024 + n``, the
    offsets taken off the weights' sum at the end) the read was 0.98x the time but its error
    grew 2.5-5x (the offsets' product, about 1,032 times the weights, summed on tensor cores
    over 1,024 rows), past the tests' bound on an H100; deleted (docs/benchmarks.md, "The
    int4 read timed: words for keys, 128-row tiles").

    ``key_words`` reads the keys as the values are read, 16-bit words of four (where both
    rings' rows start on even bytes): four products of a query operand a position in the
    word, whose tiles load with ``ldmatrix`` (the byte form's operands take a register move
    each: 0.82x the loop's instructions by `bench/kernel_sass.py`)."""
    batch, heads, head_dim = q.shape
    split_rows = SPLIT_ROWS if split_rows is None else split_rows
    block_rows = BLOCK_ROWS if block_rows is None else block_rows
    num_warps = NUM_WARPS if num_warps is None else num_warps
    num_stages = NUM_STAGES if num_stages is None else num_stages
    max_registers = MAX_REGISTERS if max_registers is None else max_registers
    key_words = KEY_WORDS if key_words is None else key_words
    key_dp4a = KEY_DP4A if key_dp4a is None else key_dp4a
    value_subnormals = VALUE_SUBNORMALS if value_subnormals is None else value_subnormals
    row_mix = ROW_MIX if row_mix is None else row_mix
    whole_tiles = WHOLE_TILES if whole_tiles is None else whole_tiles
    (k_packed, k_scales), (v_packed, v_scales) = keys, values
    context = k_packed.shape[2]
    if head_dim & (head_dim - 1) or head_dim % group or group % 2:
        raise ValueError("ring_attention_int4 needs a power-of-two head_dim, a multiple of group")
    if any(t.stride(-1) != 1 for t in (k_packed, k_scales, v_packed, v_scales)):
        raise ValueError("ring_attention_int4 needs contiguous rows")
    if split_rows % block_rows:
        raise ValueError("split_rows must be a multiple of block_rows")
    if q.stride(-1) != 1:
        q = q.contiguous()
    splits = -(-context // split_rows)
    partial = torch.empty(batch, heads, splits, head_dim + 2, device=q.device, dtype=torch.float32)
    out = torch.empty(batch, heads, head_dim, device=q.device, dtype=q.dtype)
    # read by row index; no slots: row b reads slot b (no index tensor to build)
    lengths = lengths.contiguous()
    slots = None if slots is None else slots.contiguous()
    fits_dot = head_dim // 2 >= 16 and block_rows >= 16 and head_dim // group <= 16
    if dot is None:
        dot = q.is_cuda and fits_dot
    elif dot and not fits_dot:  # a tile of 16 rows; a row's groups are the dot's 16 rows
        raise ValueError("dot needs head_dim >= 32, block_rows >= 16, at most 16 groups a row")
    v_pairs = dot and _value_words_fit(v_packed, head_dim, group)
    k_dp4a = v_pairs and key_dp4a and _dp4a_fits(k_packed, head_dim, group)
    if not k_dp4a:  # the other forms take the rounded query; the dp4a form rounds it itself
        q = round_query(q, group)
    _ring_attention_int4[(batch, heads, splits)](
        q,
        k_packed,
        k_scales,
        v_packed,
        v_scales,
        lengths,
        lengths if slots is None else slots,  # not read without SLOTS
        partial,
        q.stride(0),
        q.stride(1),
        k_packed.stride(0),
        k_packed.stride(1),
        k_packed.stride(2),
        k_scales.stride(0),
        k_scales.stride(1),
        k_scales.stride(2),
        v_packed.stride(0),
        v_packed.stride(1),
        v_packed.stride(2),
        v_scales.stride(0),
        v_scales.stride(1),
        v_scales.stride(2),
        1.0 / math.sqrt(head_dim),
        splits,
        SPLIT_ROWS=split_rows,
        BLOCK_ROWS=block_rows,
        HALF=head_dim // 2,
        GROUP=group,
        num_warps=num_warps,
        num_stages=num_stages,
        DOT=dot,
        # the interpreter (host tensors) has neither 16-bit dots nor inline assembly
        ASM=q.is_cuda,
        DOT_DTYPE=tl.float16 if q.is_cuda else tl.float32,
        WORD_BITS=_scale_word_bits(k_scales, v_scales) if dot else 0,
        V_PAIRS=v_pairs,
        K_DP4A=k_dp4a,
        V_SUB=v_pairs and value_subnormals,
        ROW_MIX=k_dp4a and row_mix,
        WHOLE_TILES=whole_tiles,
        K_WORDS=v_pairs
        and not k_dp4a
        and key_words
        and _value_words_fit(k_packed, head_dim, group),
        SLOTS=slots is not None,
        **({"maxnreg": max_registers} if max_registers and q.is_cuda else {}),
    )
    merge_splits(partial, out)
    return out


if _triton.available():

    @triton.jit
    def _low_level(packed):
        """The low nibbles' levels (``n - 8``) as float32, with no conversion instruction:
        ``n`` in the mantissa of 2**23 (``0x4B000000``), then 2**23 + 8 taken off."""
        bits = (packed.to(tl.int32) & 15) | 0x4B000000
        return bits.to(tl.float32, bitcast=True) - 8388616.0

    @triton.jit
    def _high_level(packed):
        """The high nibbles' levels, as `_low_level`."""
        bits = (packed.to(tl.int32) >> 4) | 0x4B000000
        return bits.to(tl.float32, bitcast=True) - 8388616.0

    _UNPACK_ASM = tl.constexpr("""{
    .reg .b32 c, a, b, t, bias, sixteenth, shift;
    mov.b32 c, 0x64646464;
    mov.b32 bias, 0x64086408;
    mov.b32 sixteenth, 0x2C002C00;
    mov.b32 shift, 0xD480D480;
    prmt.b32 a, $4, c, 0x5140;
    prmt.b32 b, $4, c, 0x7362;
    and.b32 t, a, 0xFF0FFF0F;
    sub.f16x2 $0, t, bias;
    and.b32 t, b, 0xFF0FFF0F;
    sub.f16x2 $1, t, bias;
    and.b32 t, a, 0xFFF0FFF0;
    fma.rn.f16x2 $2, t, sixteenth, shift;
    and.b32 t, b, 0xFFF0FFF0;
    fma.rn.f16x2 $3, t, sixteenth, shift;
    }""")
    """Four packed bytes -> the four low nibbles' levels and the four high ones', float16.

    Two bytes go into the low bytes of a word's halves with 0x64 above each (``prmt``);
    one mask keeps a nibble, and the half is 1024 + n exactly (n in its mantissa), less
    1032 its level ``n - 8``; a high nibble stays where it is, 1024 + 16 n, so it is
    scaled by 1/16 and 72 taken off in one fused multiply-add, exact in float16. Ten
    instructions for eight values, each on two values at once, and one immediate an
    instruction (a mask and an OR of two would make ptxas load one of them a register
    each time). The integer steps give the very words of the first form of this PTX
    (mask, then OR 0x64006400; timed on an H100), checked by emulating both on 200,000
    random words; `tests/kernels/test_ptx_unpack.py` runs every PTX block here against
    the integer form the CPU path uses."""

    _UNPACK_PAIR_ASM = tl.constexpr("""{
    .reg .b32 c, a, b, t, bias, sixteenth, shift;
    mov.b32 c, 0x64646464;
    mov.b32 bias, 0x64086408;
    mov.b32 sixteenth, 0x2C002C00;
    mov.b32 shift, 0xD480D480;
    prmt.b32 a, $4, c, 0x5240;
    prmt.b32 b, $4, c, 0x7341;
    and.b32 t, a, 0xFF0FFF0F;
    sub.f16x2 $0, t, bias;
    and.b32 t, a, 0xFFF0FFF0;
    fma.rn.f16x2 $1, t, sixteenth, shift;
    and.b32 t, b, 0xFF0FFF0F;
    sub.f16x2 $2, t, bias;
    and.b32 t, b, 0xFFF0FFF0;
    fma.rn.f16x2 $3, t, sixteenth, shift;
    }""")
    """Two 16-bit words (each two packed bytes: four values) -> the levels of each word's
    value 0, 1, 2 and 3 (its first byte's low and high nibble, then its second's), float16,
    as `_UNPACK_ASM` does for bytes."""

    @triton.jit
    def _pair_unpacked(pairs, TEXT: tl.constexpr):
        """Two 16-bit words a call of the PTX ``TEXT`` -> each word's four values by position."""
        return tl.inline_asm_elementwise(
            TEXT,
            "=r,=r,=r,=r,r",
            [pairs],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True,
            pack=2,
        )

    @triton.jit
    def _word_nibbles(pairs):
        """Each 16-bit word's four nibbles, int32, low first: the integer form of the PTX
        unpacks below, which the interpreter (no inline assembly) runs."""
        word = pairs.to(tl.int32) & 0xFFFF
        return word & 15, (word >> 4) & 15, (word >> 8) & 15, word >> 12

    @triton.jit
    def _pair_levels(pairs, ASM: tl.constexpr, DTYPE: tl.constexpr):
        """Each 16-bit word's four levels (values ``4m`` to ``4m + 3`` of word ``m``)."""
        if ASM:
            v0, v1, v2, v3 = _pair_unpacked(pairs, _UNPACK_PAIR_ASM)
        else:
            n0, n1, n2, n3 = _word_nibbles(pairs)
            v0, v1 = (n0 - 8).to(DTYPE), (n1 - 8).to(DTYPE)
            v2, v3 = (n2 - 8).to(DTYPE), (n3 - 8).to(DTYPE)
        return v0, v1, v2, v3

    _PAIR_SUBNORMAL_ASM = tl.constexpr("""{
    .reg .b32 t;
    and.b32 $0, $4, 0x000F000F;
    and.b32 $1, $4, 0x00F000F0;
    shr.b32 t, $4, 8;
    and.b32 $2, t, 0x000F000F;
    and.b32 $3, t, 0x00F000F0;
    }""")
    """Two 16-bit words (pack 2) -> each word's four nibbles ``n`` as float16 subnormals:
    ``n 2**-24`` (values 0 and 2 of a word, the nibble at bit 0 of a half) and ``16 n
    2**-24`` (1 and 3, at bit 4): a mask each, and one shift for the second byte's, five
    instructions for eight values where `_UNPACK_PAIR_ASM` takes ten."""

    @triton.jit
    def _pair_subnormals(pairs, ASM: tl.constexpr, DTYPE: tl.constexpr):
        """Each 16-bit word's four nibbles as `_PAIR_SUBNORMAL_ASM` makes them."""
        if ASM:
            v0, v1, v2, v3 = _pair_unpacked(pairs, _PAIR_SUBNORMAL_ASM)
        else:
            n0, n1, n2, n3 = _word_nibbles(pairs)
            tiny = 5.9604644775390625e-08  # 2**-24
            v0 = (n0.to(tl.float32) * tiny).to(DTYPE)
            v1 = (n1.to(tl.float32) * (16 * tiny)).to(DTYPE)
            v2 = (n2.to(tl.float32) * tiny).to(DTYPE)
            v3 = (n3.to(tl.float32) * (16 * tiny)).to(DTYPE)
        return v0, v1, v2, v3

    _UNPACK_PAIR_RAW_ASM = tl.constexpr("""{
    .reg .b32 t, magic;
    mov.b32 magic, 0x64006400;
    lop3.b32 $0, $4, 0x000F000F, magic, 0xEA;
    lop3.b32 $1, $4, 0x00F000F0, magic, 0xEA;
    shr.b32 t, $4, 8;
    lop3.b32 $2, t, 0x000F000F, magic, 0xEA;
    lop3.b32 $3, t, 0x00F000F0, magic, 0xEA;
    }""")
    """Two 16-bit words (pack 2) -> each word's four nibbles ``n`` with their float16
    offsets, as `_UNPACK_PAIR_ASM` orders them: values 0 and 2 of a word ``1024 + n``, 1 and 3
    ``1024 + 16 n``. A nibble at bit 0 (or 4) of each half is masked in place and 0x6400
    ORed above it by one ``lop3`` (``(a & b) | c``, table 0xEA), the second byte's after one
    shift: five instructions for eight values, where `_UNPACK_PAIR_ASM` takes ten and a
    ``prmt`` form six. The kernel takes the keys' offsets off their sums (``K_WORDS``)."""

    @triton.jit
    def _pair_raw_levels(pairs, ASM: tl.constexpr, DTYPE: tl.constexpr):
        """Each 16-bit word's four nibbles ``n`` as ``1024 + n`` (values 0 and 2) and
        ``1024 + 16 n`` (values 1 and 3)."""
        if ASM:
            v0, v1, v2, v3 = _pair_unpacked(pairs, _UNPACK_PAIR_RAW_ASM)
        else:
            n0, n1, n2, n3 = _word_nibbles(pairs)
            v0, v2 = (n0 + 1024).to(DTYPE), (n2 + 1024).to(DTYPE)
            v1, v3 = (n1 * 16 + 1024).to(DTYPE), (n3 * 16 + 1024).to(DTYPE)
        return v0, v1, v2, v3

    _UNPACK_RAW_ASM = tl.constexpr("""{
    .reg .b32 c, a, b;
    mov.b32 c, 0x64646464;
    prmt.b32 a, $4, c, 0x5140;
    prmt.b32 b, $4, c, 0x7362;
    and.b32 $0, a, 0xFF0FFF0F;
    and.b32 $1, b, 0xFF0FFF0F;
    and.b32 $2, a, 0xFFF0FFF0;
    and.b32 $3, b, 0xFFF0FFF0;
    }""")
    """`_UNPACK_ASM` without its subtract and multiply-add: four instructions fewer for
    eight values. A low nibble is left ``1024 + n`` and a high one ``1024 + 16 n``; the
    kernel takes the offsets off the products' sums (exact in float16; the sums are
    float32)."""

    @triton.jit
    def _unpacked(packed, TEXT: tl.constexpr):
        """Four packed bytes a call of the PTX ``TEXT`` -> the low and the high nibbles."""
        return tl.inline_asm_elementwise(
            TEXT, "=r,=r,=r,=r,r", [packed], dtype=(tl.float16, tl.float16), is_pure=True, pack=4
        )

    @triton.jit
    def _raw_levels(packed, ASM: tl.constexpr, DTYPE: tl.constexpr):
        """Each byte's nibbles ``n`` as ``1024 + n`` (low) and ``1024 + 16 n`` (high)."""
        if ASM:
            low, high = _unpacked(packed, _UNPACK_RAW_ASM)
        else:
            low = ((packed.to(tl.int32) & 15) + 1024).to(DTYPE)
            high = ((packed.to(tl.int32) >> 4) * 16 + 1024).to(DTYPE)
        return low, high

    @triton.jit
    def _levels(packed, ASM: tl.constexpr, DTYPE: tl.constexpr):
        """Each byte's low and high nibble levels (``n - 8``), as ``DTYPE``."""
        if ASM:
            low, high = _unpacked(packed, _UNPACK_ASM)
        else:
            low = _low_level(packed).to(DTYPE)
            high = _high_level(packed).to(DTYPE)
        return low, high

    _DP4A_ASM = tl.constexpr("""{
    .reg .b32 lo, hi;
    and.b32 lo, $1, 0x0F0F0F0F;
    shr.b32 hi, $1, 4;
    and.b32 hi, hi, 0x0F0F0F0F;
    dp4a.u32.s32 $0, lo, $2, 0;
    dp4a.u32.s32 $0, hi, $3, $0;
    }""")

    @triton.jit
    def _dp4a_nibbles(words, q_lo, q_hi, ASM: tl.constexpr):
        """Each 32-bit word's eight nibbles ``n`` (bytes' low nibbles the even values)
        times the 8-bit query values packed as ``q_lo`` (even) and ``q_hi`` (odd), summed."""
        if ASM:
            total = tl.inline_asm_elementwise(
                _DP4A_ASM, "=r,r,r,r", [words, q_lo, q_hi], dtype=tl.int32, is_pure=True, pack=1
            )
        else:
            total = tl.zeros(words.shape, tl.int32)
            for k in tl.static_range(4):
                low = (words >> (8 * k)) & 15
                high = (words >> (8 * k + 4)) & 15
                total += low * ((q_lo << (24 - 8 * k)) >> 24)
                total += high * ((q_hi << (24 - 8 * k)) >> 24)
        return total

    @triton.jit
    def _int8_query(q_base, wi, GROUPS: tl.constexpr, GROUP: tl.constexpr):
        """`round_query` in the kernel, as the dp4a products take it: each group's levels
        packed four to a 32-bit word in the keys' byte order (word ``w`` of ``q_lo`` holds
        values ``8w + 2k`` in byte ``k``, of ``q_hi`` values ``8w + 2k + 1``), each group's
        offset (8 times its levels' sum: the keys' nibbles are stored plus 8) and its scale
        (its largest magnitude / 127). The divisions are IEEE ones, as torch's."""
        WORDS: tl.constexpr = GROUP // 8  # 32-bit key words a group
        k4 = tl.arange(0, 4)
        even = tl.load(q_base + 8 * wi[:, None] + 2 * k4[None, :]).to(tl.float32)
        odd = tl.load(q_base + 8 * wi[:, None] + 2 * k4[None, :] + 1).to(tl.float32)
        word_top = tl.max(tl.maximum(tl.abs(even), tl.abs(odd)), axis=1)
        top = tl.max(tl.reshape(word_top, [GROUPS, WORDS]), axis=1)  # [GROUPS]
        inverse = tl.where(top > 0, tl.math.div_rn(127.0, tl.where(top > 0, top, 1.0)), 0.0)
        by_word = tl.reshape(tl.broadcast_to(inverse[:, None], [GROUPS, WORDS]), [GROUPS * WORDS])
        even8 = _nearest_even(even * by_word[:, None]).to(tl.int32)
        odd8 = _nearest_even(odd * by_word[:, None]).to(tl.int32)
        q_lo = tl.sum((even8 & 0xFF) << (8 * k4[None, :]), axis=1)  # disjoint bits: an OR
        q_hi = tl.sum((odd8 & 0xFF) << (8 * k4[None, :]), axis=1)
        levels = tl.sum(tl.reshape(tl.sum(even8 + odd8, axis=1), [GROUPS, WORDS]), axis=1)
        return q_lo, q_hi, 8 * levels, tl.math.div_rn(top, 127.0)

    @triton.jit
    def _word_query(q_words, C: tl.constexpr, own4, scale, DTYPE: tl.constexpr):
        """``[16, words]``: row ``g`` holds the query's value ``4m + C`` (times ``scale``) at
        each word ``m`` of group ``g``, zeros elsewhere: the operand of position ``C``'s
        product; a sixteenth of it for the high nibbles (``C`` odd), kept ``1024 + 16 n``."""
        values = tl.load(q_words + C).to(tl.float32) * scale
        if C % 2:
            values = values / 16
        return tl.where(own4, values[None, :], 0.0).to(DTYPE)

    @triton.jit
    def _row_scales(base, rows, filled, gk, stride, WORD_BITS: tl.constexpr):
        """``[rows, groups]`` float32: each key row's scales, loaded as one word a row where
        ``WORD_BITS`` is 64 (a row's four float16 scales; else one by one)."""
        if WORD_BITS == 64:
            word = tl.load(base.to(tl.pointer_type(tl.int64)) + rows, mask=filled, other=0)
            field = (word[:, None] >> (16 * gk[None, :]).to(tl.int64)) & 0xFFFF
            scales = field.to(tl.int16).to(tl.float16, bitcast=True)
        else:
            scales = tl.load(
                base + rows[:, None] * stride + gk[None, :], mask=filled[:, None], other=0.0
            )
        return scales.to(tl.float32)

    @triton.jit
    def _group_scales(
        base, rows, filled, g, grouped, stride, GROUPS: tl.constexpr, WORD_BITS: tl.constexpr
    ):
        """``[16, rows]`` float32: row ``g < GROUPS`` holds each key row's group-``g`` scale,
        the rows below zeros. With ``WORD_BITS`` (a row's scales' width: 16, 32 or 64; 0:
        off) each row's scales are loaded as one word and cut apart in registers, which
        lands them in the layout of the dot's output (no conversion through shared memory,
        no load a scale)."""
        if WORD_BITS == 0:
            scales = tl.load(
                base + rows[None, :] * stride + g[:, None],
                mask=grouped[:, None] & filled[None, :],
                other=0.0,
            )
        else:
            if WORD_BITS == 64:
                words = base.to(tl.pointer_type(tl.int64))
            elif WORD_BITS == 32:
                words = base.to(tl.pointer_type(tl.int32))
            else:
                words = base.to(tl.pointer_type(tl.int16))
            word = tl.load(words + rows, mask=filled, other=0).to(tl.int64)
            shift = (16 * tl.minimum(g, GROUPS - 1)).to(tl.int64)  # never past the word
            field = (word[None, :] >> shift[:, None]) & 0xFFFF
            scales = tl.where(grouped[:, None], field, 0).to(tl.int16).to(tl.float16, bitcast=True)
        return scales.to(tl.float32)

    @triton.jit
    def _ring_attention_int4(
        q_ptr,
        kp_ptr,
        ks_ptr,
        vp_ptr,
        vs_ptr,
        len_ptr,
        slot_ptr,
        part_ptr,
        stride_qb,
        stride_qh,
        stride_kps,
        stride_kph,
        stride_kpr,
        stride_kss,
        stride_ksh,
        stride_ksr,
        stride_vps,
        stride_vph,
        stride_vpr,
        stride_vss,
        stride_vsh,
        stride_vsr,
        scale,
        splits,
        SPLIT_ROWS: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        HALF: tl.constexpr,
        GROUP: tl.constexpr,
        DOT: tl.constexpr,
        ASM: tl.constexpr,
        DOT_DTYPE: tl.constexpr,
        WORD_BITS: tl.constexpr,
        V_PAIRS: tl.constexpr,
        K_WORDS: tl.constexpr,
        K_DP4A: tl.constexpr,
        V_SUB: tl.constexpr,
        ROW_MIX: tl.constexpr,
        WHOLE_TILES: tl.constexpr,
        SLOTS: tl.constexpr,
    ):
        """One split of one (row, head). Elementwise (``DOT`` off): each row's scales are
        loaded once, the key's dot summed within a group and then scaled, the value
        weights a row's weight times its group's scale. On tensor cores (``DOT``): the
        dot's 16 rows are the row's groups: row ``g`` of the query operand holds the
        query's values in group ``g`` and zeros elsewhere, so one product gives each key
        row's per-group sums, which its scales then weigh; for the values, row ``g`` of the
        weights operand is each key row's softmax weight times its group-``g`` scale, and
        only group ``g``'s columns of that output row are kept (at the end: the sums are
        linear). With ``V_PAIRS`` the values are read as 16-bit words of four values, whose
        tile Triton moves into the product's operand layout a word at a time (not a byte at
        a time, as the product needs consecutive rows of one column), and value ``c`` of
        every word is its own product (four accumulators, one for each ``c``); and the
        keys' levels keep their offsets (`_raw_levels`), which come off each group's sums
        as one subtraction (a constant of the query)."""
        GROUPS: tl.constexpr = 2 * HALF // GROUP
        BYTES: tl.constexpr = GROUP // 2  # bytes of a group: its GROUP values, two a byte
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        length = tl.load(len_ptr + b).to(tl.int32)
        slot = b.to(tl.int64)
        if SLOTS:
            slot = tl.load(slot_ptr + b).to(tl.int64)
        start = s * SPLIT_ROWS
        end = tl.minimum(start + SPLIT_ROWS, length)
        j = tl.arange(0, HALF)  # byte j holds values 2j (low nibble) and 2j + 1 (high)
        q_base = q_ptr + b * stride_qb + h * stride_qh
        q_even = tl.load(q_base + 2 * j).to(tl.float32) * scale
        q_odd = tl.load(q_base + 2 * j + 1).to(tl.float32) * scale
        kp_base = kp_ptr + slot * stride_kps + h * stride_kph
        ks_base = ks_ptr + slot * stride_kss + h * stride_ksh
        vp_base = vp_ptr + slot * stride_vps + h * stride_vph
        vs_base = vs_ptr + slot * stride_vss + h * stride_vsh
        best = tl.full([], float("-inf"), tl.float32)
        total = tl.full([], 0.0, tl.float32)
        if DOT:
            g = tl.arange(0, 16)  # the dot's rows: row g < GROUPS stands for group g
            own = g[:, None] == (j // BYTES)[None, :]  # [16, HALF]: byte j's group is row g
            grouped = g < GROUPS
            q_low = tl.where(own, q_even[None, :], 0.0).to(DOT_DTYPE)
            q_high = tl.where(own, q_odd[None, :], 0.0).to(DOT_DTYPE)
            if V_PAIRS:
                m = tl.arange(0, HALF // 2)
                own4 = g[:, None] == (m // (GROUP // 4))[None, :]
                acc_even = tl.zeros([16, HALF // 2], dtype=tl.float32)
                acc_odd = tl.zeros([16, HALF // 2], dtype=tl.float32)
                acc_2 = tl.zeros([16, HALF // 2], dtype=tl.float32)
                acc_3 = tl.zeros([16, HALF // 2], dtype=tl.float32)
                if V_SUB:  # the weights, summed over rows at the end: the values' offsets
                    mix_sum = tl.zeros([16, BLOCK_ROWS], dtype=tl.float32)
                vw_base = vp_base.to(tl.pointer_type(tl.int16))
                # without dp4a the keys are unpacked as 1024 + n and 1024 + 16 n
                # (`_raw_levels`): the query's high half a sixteenth (exact), each group's
                # offset taken off its sums
                if K_DP4A:  # the query in 8 bits a group, four values a 32-bit word
                    gk = tl.arange(0, GROUPS)
                    wi = tl.arange(0, HALF // 4)
                    q_lo, q_hi, k_bias8, q_scale = _int8_query(q_base, wi, GROUPS, GROUP)
                    q_scale = q_scale * scale
                    k32_base = kp_base.to(tl.pointer_type(tl.int32))
                elif K_WORDS:  # the query by position in a word: value 4m + c of word m
                    q_words = q_base + 4 * m
                    q0 = _word_query(q_words, 0, own4, scale, DOT_DTYPE)
                    q1 = _word_query(q_words, 1, own4, scale, DOT_DTYPE)
                    q2 = _word_query(q_words, 2, own4, scale, DOT_DTYPE)
                    q3 = _word_query(q_words, 3, own4, scale, DOT_DTYPE)
                    k_bias = 1032.0 * tl.sum(q0.to(tl.float32) + q2.to(tl.float32), axis=1)
                    k_bias += 1152.0 * tl.sum(q1.to(tl.float32) + q3.to(tl.float32), axis=1)
                    kw_base = kp_base.to(tl.pointer_type(tl.int16))
                else:
                    q_high16 = (q_high.to(tl.float32) / 16).to(DOT_DTYPE)
                    low_sum = tl.sum(q_low.to(tl.float32), axis=1)
                    high_sum = tl.sum(q_high16.to(tl.float32), axis=1) * 16
                    k_bias = 1032.0 * low_sum + 72.0 * high_sum
            else:
                acc_even = tl.zeros([16, HALF], dtype=tl.float32)
                acc_odd = tl.zeros([16, HALF], dtype=tl.float32)
        else:
            g = tl.arange(0, GROUPS)
            acc_even = tl.zeros([HALF], dtype=tl.float32)
            acc_odd = tl.zeros([HALF], dtype=tl.float32)
        # with WHOLE_TILES the split's whole tiles are read without masks, then its last,
        # partial tile (if any) with them: the masks cost a tenth of the loop's instructions
        whole_end = end
        if WHOLE_TILES:
            whole_end = start + tl.maximum(end - start, 0) // BLOCK_ROWS * BLOCK_ROWS
        for TAIL in tl.static_range(2 if WHOLE_TILES else 1):
            lo = start if TAIL == 0 else whole_end
            hi = whole_end if TAIL == 0 else end
            for row in range(lo, hi, BLOCK_ROWS):
                rows = row + tl.arange(0, BLOCK_ROWS)
                if WHOLE_TILES and TAIL == 0:
                    filled = tl.full([BLOCK_ROWS], 1, tl.int1)
                else:
                    filled = rows < end
                if K_DP4A:
                    k32 = tl.load(
                        k32_base + rows[:, None] * (stride_kpr // 4) + wi[None, :],
                        mask=filled[:, None],
                        other=0,
                    )
                elif K_WORDS:
                    kw = tl.load(
                        kw_base + rows[:, None] * (stride_kpr // 2) + m[None, :],
                        mask=filled[:, None],
                        other=0,
                    )
                else:
                    kp = tl.load(
                        kp_base + rows[:, None] * stride_kpr + j[None, :],
                        mask=filled[:, None],
                        other=0,
                    )
                if DOT and K_DP4A:
                    dots = _dp4a_nibbles(k32, q_lo[None, :], q_hi[None, :], ASM)
                    per_group = tl.sum(tl.reshape(dots, [BLOCK_ROWS, GROUPS, GROUP // 8]), axis=2)
                    ks = _row_scales(ks_base, rows, filled, gk, stride_ksr, WORD_BITS)
                    per_group = (per_group - k_bias8[None, :]).to(tl.float32)
                    raw = tl.sum(per_group * (ks * q_scale[None, :]), axis=1)
                elif DOT:
                    if K_WORDS:
                        k0, k1, k2, k3 = _pair_raw_levels(kw, ASM, DOT_DTYPE)
                        sums = tl.dot(q0, tl.trans(k0), input_precision="ieee")
                        sums = tl.dot(q1, tl.trans(k1), sums, input_precision="ieee")
                        sums = tl.dot(q2, tl.trans(k2), sums, input_precision="ieee")
                        sums = tl.dot(q3, tl.trans(k3), sums, input_precision="ieee")
                        sums = sums - k_bias[:, None]
                    elif V_PAIRS:
                        k_low, k_high = _raw_levels(kp, ASM, DOT_DTYPE)
                        sums = tl.dot(q_low, tl.trans(k_low), input_precision="ieee")
                        sums = tl.dot(q_high16, tl.trans(k_high), sums, input_precision="ieee")
                        sums = sums - k_bias[:, None]
                    else:
                        k_low, k_high = _levels(kp, ASM, DOT_DTYPE)
                        sums = tl.dot(q_low, tl.trans(k_low), input_precision="ieee")
                        sums = tl.dot(q_high, tl.trans(k_high), sums, input_precision="ieee")
                    ks = _group_scales(
                        ks_base, rows, filled, g, grouped, stride_ksr, GROUPS, WORD_BITS
                    )
                    raw = tl.sum(sums * ks, axis=0)
                else:
                    ks = tl.load(
                        ks_base + rows[:, None] * stride_ksr + g[None, :],
                        mask=filled[:, None],
                        other=0.0,
                    ).to(tl.float32)  # [rows, groups]
                    dots = _low_level(kp) * q_even[None, :] + _high_level(kp) * q_odd[None, :]
                    per_group = tl.sum(tl.reshape(dots, [BLOCK_ROWS, GROUPS, BYTES]), axis=2)
                    raw = tl.sum(per_group * ks, axis=1)
                scores = tl.where(filled, raw, float("-inf"))
                new_best = tl.maximum(best, tl.max(scores, axis=0))
                rescale = tl.exp(best - new_best)
                weights = tl.exp(scores - new_best)
                if DOT and V_PAIRS:
                    vw = tl.load(
                        vw_base + rows[:, None] * (stride_vpr // 2) + m[None, :],
                        mask=filled[:, None],
                        other=0,
                    )
                    if V_SUB:
                        v0, v1, v2, v3 = _pair_subnormals(vw, ASM, DOT_DTYPE)
                    else:
                        v0, v1, v2, v3 = _pair_levels(vw, ASM, DOT_DTYPE)
                    if ROW_MIX:  # weighed as [rows, groups], then made the [16, rows] operand
                        vs = _row_scales(vs_base, rows, filled, gk, stride_vsr, WORD_BITS)
                        mix = tl.trans(vs * weights[:, None])  # [groups, rows]
                        mix = tl.broadcast_to(mix[None, :, :], [16 // GROUPS, GROUPS, BLOCK_ROWS])
                        mix = tl.where(grouped[:, None], tl.reshape(mix, [16, BLOCK_ROWS]), 0.0)
                        mix = mix.to(DOT_DTYPE)
                    else:
                        vs = _group_scales(
                            vs_base, rows, filled, g, grouped, stride_vsr, GROUPS, WORD_BITS
                        )
                        mix = (vs * weights[None, :]).to(DOT_DTYPE)  # [16, rows]
                    if V_SUB:  # summed over rows once, at the end
                        mix_sum = mix_sum * rescale + mix.to(tl.float32)
                    acc_even = tl.dot(mix, v0, acc_even * rescale, input_precision="ieee")
                    acc_odd = tl.dot(mix, v1, acc_odd * rescale, input_precision="ieee")
                    acc_2 = tl.dot(mix, v2, acc_2 * rescale, input_precision="ieee")
                    acc_3 = tl.dot(mix, v3, acc_3 * rescale, input_precision="ieee")
                elif DOT:
                    vp = tl.load(
                        vp_base + rows[:, None] * stride_vpr + j[None, :],
                        mask=filled[:, None],
                        other=0,
                    )
                    v_low, v_high = _levels(vp, ASM, DOT_DTYPE)
                    vs = _group_scales(
                        vs_base, rows, filled, g, grouped, stride_vsr, GROUPS, WORD_BITS
                    )
                    mix = (vs * weights[None, :]).to(DOT_DTYPE)  # [16, rows]
                    acc_even = tl.dot(mix, v_low, acc_even * rescale, input_precision="ieee")
                    acc_odd = tl.dot(mix, v_high, acc_odd * rescale, input_precision="ieee")
                else:
                    vp = tl.load(
                        vp_base + rows[:, None] * stride_vpr + j[None, :],
                        mask=filled[:, None],
                        other=0,
                    )
                    vs = tl.load(
                        vs_base + rows[:, None] * stride_vsr + g[None, :],
                        mask=filled[:, None],
                        other=0.0,
                    ).to(tl.float32)
                    by_group = (
                        weights[:, None] * vs
                    )  # [rows, groups]: a value's weight, its group's
                    w = tl.reshape(
                        tl.broadcast_to(by_group[:, :, None], [BLOCK_ROWS, GROUPS, BYTES]),
                        [BLOCK_ROWS, HALF],
                    )
                    acc_even = acc_even * rescale + tl.sum(w * _low_level(vp), 0)
                    acc_odd = acc_odd * rescale + tl.sum(w * _high_level(vp), 0)
                total = total * rescale + tl.sum(weights, axis=0)
                best = new_best
        part = part_ptr + ((b * tl.num_programs(1) + h) * splits + s) * (2 * HALF + 2)
        if DOT and V_PAIRS:  # accumulator c holds values 4m + c; row g keeps group g's
            if V_SUB:  # nibbles n as n 2**-24 (c even), 16 n 2**-24 (odd): levels n - 8
                offset = 8.0 * tl.sum(mix_sum, axis=1)[:, None]
                acc_even = acc_even * 16777216.0 - offset
                acc_odd = acc_odd * 1048576.0 - offset
                acc_2 = acc_2 * 16777216.0 - offset
                acc_3 = acc_3 * 1048576.0 - offset
            tl.store(part + 4 * m, tl.sum(tl.where(own4, acc_even, 0.0), axis=0))
            tl.store(part + 4 * m + 1, tl.sum(tl.where(own4, acc_odd, 0.0), axis=0))
            tl.store(part + 4 * m + 2, tl.sum(tl.where(own4, acc_2, 0.0), axis=0))
            tl.store(part + 4 * m + 3, tl.sum(tl.where(own4, acc_3, 0.0), axis=0))
        else:
            if DOT:  # row g of each accumulator holds group g's columns
                acc_even = tl.sum(tl.where(own, acc_even, 0.0), axis=0)
                acc_odd = tl.sum(tl.where(own, acc_odd, 0.0), axis=0)
            tl.store(part + 2 * j, acc_even)
            tl.store(part + 2 * j + 1, acc_odd)
        tl.store(part + 2 * HALF, best)
        tl.store(part + 2 * HALF + 1, total)

    @triton.jit
    def _nearest_even(x):
        """``x`` (``|x| < 2**22``) rounded to the nearest integer, ties to even, as
        ``torch.round``: adding 1.5 * 2**23 leaves no fraction bits, and float32 addition
        rounds to nearest even (the interpreter has no libdevice ``rint``)."""
        return (x + 12582912.0) - 12582912.0

    @triton.jit
    def _write_one_ring(src, packed_ptr, scale_ptr, slot, row, active, h, stride_ps, stride_ph,
                        stride_pr, stride_ss, stride_sh, stride_sr, HALF: tl.constexpr,
                        GROUP: tl.constexpr):  # fmt: skip
        GROUPS: tl.constexpr = 2 * HALF // GROUP
        BYTES: tl.constexpr = GROUP // 2
        j = tl.arange(0, HALF)
        even = tl.load(src + 2 * j).to(tl.float32)
        odd = tl.load(src + 2 * j + 1).to(tl.float32)
        magnitude = tl.reshape(tl.maximum(tl.abs(even), tl.abs(odd)), [GROUPS, BYTES])
        scale = tl.math.div_rn(tl.max(magnitude, axis=1), 7.0).to(tl.float16)  # [GROUPS]
        by_byte = tl.reshape(
            tl.broadcast_to(scale.to(tl.float32)[:, None], [GROUPS, BYTES]), [HALF]
        )
        safe = tl.where(by_byte > 0, by_byte, 1.0)
        low = tl.where(by_byte > 0, _nearest_even(tl.math.div_rn(even, safe)), 0.0)
        high = tl.where(by_byte > 0, _nearest_even(tl.math.div_rn(odd, safe)), 0.0)
        low = tl.minimum(tl.maximum(low, -8.0), 7.0).to(tl.int32) + 8
        high = tl.minimum(tl.maximum(high, -8.0), 7.0).to(tl.int32) + 8
        byte = (low | (high << 4)).to(tl.uint8)
        base = packed_ptr + slot * stride_ps + h * stride_ph + row * stride_pr
        tl.store(base + j, byte, mask=(j * 0 + active) != 0)
        g = tl.arange(0, GROUPS)
        tl.store(
            scale_ptr + slot * stride_ss + h * stride_sh + row * stride_sr + g,
            scale,
            mask=(g * 0 + active) != 0,
        )

    @triton.jit
    def _write_int4_rows(
        k_ptr,
        v_ptr,
        kp_ptr,
        ks_ptr,
        vp_ptr,
        vs_ptr,
        slot_ptr,
        row_ptr,
        active_ptr,
        stride_b,
        stride_h,
        stride_kps,
        stride_kph,
        stride_kpr,
        stride_kss,
        stride_ksh,
        stride_ksr,
        stride_vps,
        stride_vph,
        stride_vpr,
        stride_vss,
        stride_vsh,
        stride_vsr,
        HALF: tl.constexpr,
        GROUP: tl.constexpr,
    ):
        """One (row, head): its key and its value, quantized and stored."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        row = tl.load(row_ptr + b).to(tl.int64)
        active = tl.load(active_ptr + b)  # 0 or 1
        offset = b * stride_b + h * stride_h
        _write_one_ring(
            k_ptr + offset,
            kp_ptr,
            ks_ptr,
            slot,
            row,
            active,
            h,
            stride_kps,
            stride_kph,
            stride_kpr,
            stride_kss,
            stride_ksh,
            stride_ksr,
            HALF,
            GROUP,
        )
        _write_one_ring(
            v_ptr + offset,
            vp_ptr,
            vs_ptr,
            slot,
            row,
            active,
            h,
            stride_vps,
            stride_vph,
            stride_vpr,
            stride_vss,
            stride_vsh,
            stride_vsr,
            HALF,
            GROUP,
        )
