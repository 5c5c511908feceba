"""One-query decode attention over per-slot KV rings, reading only each slot's filled rows.

Layout: one layer's rings are ``[slots, H, context, D]``; a slot's rows
``[0, length)`` are filled (RoPE is applied before keys are stored, so the
order of rows in the ring does not matter). Row ``b`` of the batch attends to
slot ``slots[b]`` (or slot ``b``: the engine steps the slot prefix).

`ring_attention_reference` is the torch oracle: it gathers the rows it needs
and computes in float32. `ring_attention` is the Triton kernel
(flash-decoding): the ring is cut into splits of ``SPLIT_ROWS`` rows, one
program per (row, head, split) walks its split in ``BLOCK_ROWS`` tiles with
an online softmax, and a second kernel merges the splits. A split that starts
at or past the slot's fill exits at once, so a young session costs what it
has filled, not the whole ring; rows past the fill are never loaded (their
content does not matter, NaN included). Keys and values are loaded in their
stored dtype (float32, bf16 or float8 e4m3) and converted in registers: an
fp8 ring is read at one byte per element. No host sync: the grid depends on
shapes only, so a CUDA graph can capture it.
"""

from __future__ import annotations

import math

import torch

from . import _triton

if _triton.available():
    import triton
    import triton.language as tl

__all__ = ["SPLIT_ROWS", "ring_attention", "ring_attention_reference"]

SPLIT_ROWS = 512
"""Ring rows per program: 6 splits of a 3000-row ring (192 programs at B = 1 for 132 SMs)."""
BLOCK_ROWS = {1: 64, 2: 64, 4: 32}
"""Rows per tile of the online softmax, by ring element size. With `SPLIT_ROWS` and
`NUM_WARPS` the fastest tiling timed on an H200 for fp8 and bf16 rings at 128 sessions
(docs/benchmarks.md, "Ring decode attention kernel": 0.84x the time of 256/64/4 for fp8)."""
NUM_WARPS = 2
_DOT_DTYPES = {torch.float32: "float32", torch.float8_e4m3fn: "float16"}
"""Tensor-core operand type per ring dtype (else bf16). fp8 widens to fp16 in one
instruction per pair; the query and the softmax weights are rounded to it."""


def ring_attention_reference(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """One query per row against the filled part of its slot's ring (float32, gathered).

    Args:
        q: ``[B, H, D]`` queries (RoPE applied).
        keys, values: one layer's rings, ``[slots, H, context, D]``, any float dtype.
        lengths: ``[B]`` filled rows per row's slot (at least 1: the current frame).
        slots: ``[B]`` slot of each row; None means row ``b`` reads slot ``b``.
        max_len: at least ``max(lengths)`` (host value, so no device sync); None reads
            the whole ring.

    Returns:
        ``[B, H, D]`` in ``q``'s dtype.
    """
    if slots is None:
        slots = torch.arange(q.shape[0], device=q.device)
    rows = keys.shape[2] if max_len is None else max_len
    k = keys[slots, :, :rows].float()  # [B, H, L, D]
    v = values[slots, :, :rows].float()
    filled = torch.arange(rows, device=q.device)[None, :] < lengths[:, None]  # [B, L]
    filled = filled[:, None, :]  # [B, 1, L]
    scores = torch.einsum("bhd,bhld->bhl", q.float(), k) / math.sqrt(q.shape[-1])
    # where, not masked_fill on a product: rows past the fill may hold NaN/inf garbage.
    scores = torch.where(filled, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    v = torch.where(filled[..., None], v, 0.0)
    return torch.einsum("bhl,bhld->bhd", probs, v).to(q.dtype)


def rows_on_even_bytes(rows: torch.Tensor) -> bool:
    """Whether every row of a byte tensor starts on an even byte (16-bit words can be read)."""
    return rows.data_ptr() % 2 == 0 and all(st % 2 == 0 for st in rows.stride()[:-1])


def _value_words_fit(values: torch.Tensor) -> bool:
    """Whether an fp8 ring's values can be read as 16-bit words of two: every row starts on
    an even byte and holds at least the 16 words a product needs."""
    return (
        values.dtype == torch.float8_e4m3fn
        and values.shape[-1] >= 32
        and rows_on_even_bytes(values)
    )


def ring_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    split_rows: int = SPLIT_ROWS,
    block_rows: int | None = None,
    num_warps: int = NUM_WARPS,
    dot: bool | None = None,
    skip: torch.Tensor | None = None,
) -> torch.Tensor:
    """`ring_attention_reference` as a Triton kernel (CUDA; interpreted for host tensors).

    ``keys`` / ``values`` may be strided views (one layer of a larger pool) as
    long as the last axis is contiguous; ``lengths`` must be in ``[1, context]``.
    The tiling arguments are for tuning (bench/kernels.py); ``split_rows`` must
    be a multiple of ``block_rows``. ``dot`` puts the scores and the weighted sum
    on tensor cores (16 copies of the query); None means on CUDA with
    ``head_dim >= 16``, where it is faster (Triton's interpreter mishandles
    16-bit ``tl.dot``, so host runs use the elementwise form unless asked, and a float32
    product when asked). The tensor-core form reads an fp8 ring's values as 16-bit words of
    two where the layout allows (`_value_words_fit`; else byte by byte), one product per
    byte of the word, and keeps the products' 16 identical rows to the end instead of
    reducing them every tile: 0.61x the instructions a key row by ``bench/kernel_sass.py``;
    on an H100 at B=128 0.94x the time with staggered fills, the same at full context,
    where the read is near the card's bandwidth (docs/benchmarks.md, "Values as words, and
    Mimi's rings read in place").
    ``skip``: ``[B]`` one ring row each query leaves out besides those past its length (-1:
    none), for streams that write several rows a call (Mimi: a key written for a later query
    of the same call is not the earlier query's). It must not be the only row a split of its
    query holds (a 250-row ring is one split).
    """
    batch, heads, head_dim = q.shape
    context = keys.shape[2]
    if head_dim & (head_dim - 1) or keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("ring_attention needs a power-of-two head_dim and contiguous rows")
    if q.stride(-1) != 1:  # rows of a wider projection are read in place (their strides)
        q = q.contiguous()
    if block_rows is None:  # never a tile wider than the ring (the depth steps' is 8 rows)
        block_rows = min(BLOCK_ROWS[keys.element_size()], max(16, 1 << (context - 1).bit_length()))
    if split_rows % block_rows:
        raise ValueError("split_rows must be a multiple of block_rows")
    splits = -(-context // split_rows)
    # one split (a ring of at most split_rows rows: the depth steps', Mimi's) is written
    # out by its own program, with no partials and no merge launch
    partial = torch.empty(
        batch,
        heads,
        splits if splits > 1 else 0,
        head_dim + 2,
        device=q.device,
        dtype=torch.float32,
    )
    out = torch.empty(batch, heads, head_dim, device=q.device, dtype=q.dtype)
    # the kernel reads these by row index: a strided view (a column of [B, T]) is copied;
    # no slots: row b reads slot b (no index tensor to build, one launch fewer)
    lengths = lengths.contiguous()
    slots = None if slots is None else slots.contiguous()
    skip = None if skip is None else skip.contiguous()
    dot = (q.is_cuda and head_dim >= 16) if dot is None else dot  # tensor cores need 16
    _ring_attention_split[(batch, heads, splits)](
        q,
        keys,
        values,
        lengths,
        lengths if slots is None else slots,  # not read without SLOTS
        lengths if skip is None else skip,  # not read without SKIP
        partial,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        1.0 / math.sqrt(head_dim),
        splits,
        SPLIT_ROWS=split_rows,
        BLOCK_ROWS=block_rows,
        HEAD_DIM=head_dim,
        DOT=dot,
        DOT_DTYPE=getattr(tl, _DOT_DTYPES.get(keys.dtype, "bfloat16") if q.is_cuda else "float32"),
        V_WORDS=dot and _value_words_fit(values),
        ASM=q.is_cuda,
        SKIP=skip is not None,
        SLOTS=slots is not None,
        DIRECT=splits == 1,
        num_warps=num_warps,
    )
    if splits > 1:
        merge_splits(partial, out)
    return out


def merge_splits(partial: torch.Tensor, out: torch.Tensor) -> None:
    """Merge each (row, head)'s split partials ``[B, H, splits, D + 2]`` (the weighted sum,
    the running max, the softmax total) into ``out`` ``[B, H, D]``: the second kernel of
    every ring attention (bf16/fp8 rings here, int4 rings in ``kv_int4.py``)."""
    batch, heads, splits, width = partial.shape
    _ring_attention_merge[(batch, heads)](
        partial,
        out,
        out.stride(0),
        out.stride(1),
        splits,
        SPLITS=1 << (splits - 1).bit_length(),
        HEAD_DIM=width - 2,
    )


if _triton.available():
    _FP8_WORDS_ASM = tl.constexpr("""{
    .reg .b32 p;
    .reg .b16 even, odd;
    prmt.b32 p, $2, 0, 0x3120;
    mov.b32 {even, odd}, p;
    cvt.rn.f16x2.e4m3x2 $0, even;
    cvt.rn.f16x2.e4m3x2 $1, odd;
    }""")

    @triton.jit
    def _fp8_word_values(words, ASM: tl.constexpr, DTYPE: tl.constexpr):
        """Each 16-bit word's two e4m3 values (its low byte, its high byte) as ``DTYPE``."""
        if ASM:
            even, odd = tl.inline_asm_elementwise(
                _FP8_WORDS_ASM,
                "=r,=r,r",
                [words],
                dtype=(tl.float16, tl.float16),
                is_pure=True,
                pack=2,
            )
        else:
            word = words.to(tl.int32) & 0xFFFF
            even = (word & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DTYPE)
            odd = (word >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DTYPE)
        return even, odd

    @triton.jit
    def _ring_attention_split(
        q_ptr,
        k_ptr,
        v_ptr,
        len_ptr,
        slot_ptr,
        skip_ptr,
        part_ptr,
        out_ptr,
        stride_qb,
        stride_qh,
        stride_ob,
        stride_oh,
        stride_ks,
        stride_kh,
        stride_kr,
        stride_vs,
        stride_vh,
        stride_vr,
        scale,
        splits,
        SPLIT_ROWS: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DOT: tl.constexpr,
        DOT_DTYPE: tl.constexpr,
        V_WORDS: tl.constexpr,
        ASM: tl.constexpr,
        SKIP: tl.constexpr,
        SLOTS: tl.constexpr,
        DIRECT: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        length = tl.load(len_ptr + b).to(tl.int32)
        slot = b.to(tl.int64)
        if SLOTS:
            slot = tl.load(slot_ptr + b).to(tl.int64)
        start = s * SPLIT_ROWS
        end = tl.minimum(start + SPLIT_ROWS, length)
        skipped = -1
        if SKIP:
            skipped = tl.load(skip_ptr + b).to(tl.int32)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d).to(tl.float32) * scale
        k_base = k_ptr + slot * stride_ks + h * stride_kh
        v_base = v_ptr + slot * stride_vs + h * stride_vh
        best = tl.full([], float("-inf"), tl.float32)
        total = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        if V_WORDS:
            m = tl.arange(0, HEAD_DIM // 2)
            acc_even = tl.zeros([16, HEAD_DIM // 2], dtype=tl.float32)
            acc_odd = tl.zeros([16, HEAD_DIM // 2], dtype=tl.float32)
            total16 = tl.zeros([16], dtype=tl.float32)
            vw_base = v_base.to(tl.pointer_type(tl.int16))
        # tensor cores want 16 query rows: 16 copies of q, every product row is the same
        q_rows = tl.broadcast_to(q[None, :], (16, HEAD_DIM)).to(DOT_DTYPE)
        for row in range(start, end, BLOCK_ROWS):
            rows = row + tl.arange(0, BLOCK_ROWS)
            filled = rows < end
            if SKIP:
                filled = filled & (rows != skipped)
            k = tl.load(
                k_base + rows[:, None] * stride_kr + d[None, :],
                mask=filled[:, None],
                other=0.0,
            )
            if V_WORDS:  # the 16 identical rows kept to the end: no reduction a tile
                dots = tl.dot(q_rows, tl.trans(k.to(DOT_DTYPE)), input_precision="ieee")
                dots = tl.where(filled[None, :], dots, float("-inf"))
                new_best = tl.maximum(best, tl.max(tl.max(dots, axis=1), axis=0))
                rescale = tl.exp(best - new_best)
                weights = tl.exp(dots - new_best)
                vw = tl.load(
                    vw_base + rows[:, None] * (stride_vr // 2) + m[None, :],
                    mask=filled[:, None],
                    other=0,
                )
                v_even, v_odd = _fp8_word_values(vw, ASM, DOT_DTYPE)
                weight_rows = weights.to(DOT_DTYPE)
                acc_even = tl.dot(weight_rows, v_even, acc_even * rescale, input_precision="ieee")
                acc_odd = tl.dot(weight_rows, v_odd, acc_odd * rescale, input_precision="ieee")
                total16 = total16 * rescale + tl.sum(weights, axis=1)
            else:
                if DOT:
                    dots = tl.dot(q_rows, tl.trans(k.to(DOT_DTYPE)), input_precision="ieee")
                    raw = tl.max(dots, axis=0)
                else:
                    raw = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
                scores = tl.where(filled, raw, float("-inf"))
                new_best = tl.maximum(best, tl.max(scores, axis=0))
                rescale = tl.exp(best - new_best)
                weights = tl.exp(scores - new_best)
                v = tl.load(
                    v_base + rows[:, None] * stride_vr + d[None, :],
                    mask=filled[:, None],
                    other=0.0,
                )
                if DOT:
                    weight_rows = tl.broadcast_to(weights[None, :], (16, BLOCK_ROWS))
                    weight_rows = weight_rows.to(DOT_DTYPE)
                    mixed = tl.dot(weight_rows, v.to(DOT_DTYPE), input_precision="ieee")
                    acc = acc * rescale + tl.max(mixed, axis=0)
                else:
                    acc = acc * rescale + tl.sum(weights[:, None] * v.to(tl.float32), axis=0)
                total = total * rescale + tl.sum(weights, axis=0)
            best = new_best
        if V_WORDS:  # every row of the accumulators is the same: the first one's
            first = tl.arange(0, 16)[:, None] == 0
            even = tl.sum(tl.where(first, acc_even, 0.0), axis=0)
            odd = tl.sum(tl.where(first, acc_odd, 0.0), axis=0)
            total = tl.sum(tl.where(tl.arange(0, 16) == 0, total16, 0.0), axis=0)
        if DIRECT:  # the only split: the merge's arithmetic for one split (weight 1)
            out = out_ptr + b * stride_ob + h * stride_oh
            if V_WORDS:
                tl.store(out + 2 * m, (even / total).to(out_ptr.dtype.element_ty))
                tl.store(out + 2 * m + 1, (odd / total).to(out_ptr.dtype.element_ty))
            else:
                tl.store(out + d, (acc / total).to(out_ptr.dtype.element_ty))
        else:
            part = part_ptr + ((b * tl.num_programs(1) + h) * splits + s) * (HEAD_DIM + 2)
            if V_WORDS:
                tl.store(part + 2 * m, even)
                tl.store(part + 2 * m + 1, odd)
            else:
                tl.store(part + d, acc)
            tl.store(part + HEAD_DIM, best)
            tl.store(part + HEAD_DIM + 1, total)

    @triton.jit
    def _ring_attention_merge(
        part_ptr,
        out_ptr,
        stride_ob,
        stride_oh,
        splits,
        SPLITS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.arange(0, SPLITS)
        d = tl.arange(0, HEAD_DIM)
        used = s < splits
        part = part_ptr + (b * tl.num_programs(1) + h) * splits * (HEAD_DIM + 2)
        rows = part + s * (HEAD_DIM + 2)
        best = tl.load(rows + HEAD_DIM, mask=used, other=float("-inf"))
        total = tl.load(rows + HEAD_DIM + 1, mask=used, other=0.0)
        top = tl.max(best, axis=0)
        # an empty split has best = -inf, so its weight is exp(-inf) = 0
        weight = tl.where(best > float("-inf"), tl.exp(best - top), 0.0)
        acc = tl.load(rows[:, None] + d[None, :], mask=used[:, None], other=0.0)
        value = tl.sum(acc * weight[:, None], axis=0) / tl.sum(total * weight, axis=0)
        out = out_ptr + b * stride_ob + h * stride_oh + d
        tl.store(out, value.to(out_ptr.dtype.element_ty))
