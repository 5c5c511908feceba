"""KV rows in 4 bits: the quantizer's bounds and layout, and the int4 ring attention kernel
against its reference (Triton's interpreter on a host without a GPU)."""

from __future__ import annotations

import pytest
import torch

from duplex.kernels import ring_attention_reference, triton_available
from duplex.kernels.kv_int4 import (
    GROUP,
    SPLIT_ROWS,
    _scale_word_bits,
    _value_words_fit,
    dequantize_int4,
    int4_row_bytes,
    quantize_int4,
    ring_attention_int4,
    ring_attention_int4_reference,
    round_query,
    write_int4_rows,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_round_trip_is_within_half_a_level_and_zeros_stay_zero() -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 50, 64, generator=generator) * 5
    x[0, 0, 0] = 0.0  # a whole row of zeros: scale 0
    packed, scales = quantize_int4(x)
    assert packed.dtype == torch.uint8 and packed.shape == (4, 3, 50, 32)
    assert scales.dtype == torch.float16 and scales.shape == (4, 3, 50, 64 // GROUP)
    back = dequantize_int4(packed, scales)
    step = scales.float().repeat_interleave(GROUP, dim=-1)
    assert bool(((back - x).abs() <= step / 2 + 1e-3 * step + 1e-6).all())
    assert bool((back[0, 0, 0] == 0).all())
    assert int4_row_bytes(128) == 72.0  # 64 bytes of values, 4 float16 scales


def test_values_pack_two_to_a_byte_low_nibble_first() -> None:
    x = torch.zeros(GROUP)
    x[0], x[1] = 7.0, -7.0  # scale 1: levels 7 and -7, stored +8 as 15 and 1
    packed, scales = quantize_int4(x)
    assert float(scales[0]) == 1.0
    assert int(packed[0]) == 15 | (1 << 4)


def test_a_head_dim_the_groups_do_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple"):
        quantize_int4(torch.zeros(2, 40))


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_the_tensor_core_form_refuses_shapes_its_tile_cannot_hold() -> None:
    """A head of 16 (8 bytes a row) is narrower than a tensor-core tile; the elementwise
    form still reads it."""
    generator = torch.Generator().manual_seed(5)
    keys = quantize_int4(torch.randn(2, 1, 8, 16, generator=generator), group=16)
    values = quantize_int4(torch.randn(2, 1, 8, 16, generator=generator), group=16)
    q, lengths = torch.randn(2, 1, 16, generator=generator), torch.tensor([8, 3])
    keys = (keys[0].to(DEVICE), keys[1].to(DEVICE))
    values = (values[0].to(DEVICE), values[1].to(DEVICE))
    q, lengths = q.to(DEVICE), lengths.to(DEVICE)
    with pytest.raises(ValueError, match="dot needs"):
        ring_attention_int4(q, keys, values, lengths, group=16, dot=True)
    got = ring_attention_int4(q, keys, values, lengths, group=16, block_rows=16)
    want = ring_attention_int4_reference(q, keys, values, lengths, group=16)
    _assert_near(got, want, dot=False)


def _int4_pool(generator: torch.Generator, slots: int, heads: int, context: int, dim: int):
    keys = torch.randn(2, slots, heads, context, dim, generator=generator) * 3
    values = torch.randn(2, slots, heads, context, dim, generator=generator)
    return quantize_int4(keys), quantize_int4(values), keys, values


def _assert_near(got: torch.Tensor, want: torch.Tensor, dot: bool) -> None:
    """On a GPU the dot form's operands are float16 (a softmax weight times a scale rounds
    to 11 bits): 2e-3; elsewhere, and in the elementwise form, float32's sums: 2e-4."""
    tolerance = 2e-3 if dot and DEVICE.type == "cuda" else 2e-4
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


FORMS = [
    pytest.param({"dot": False}, id="elementwise"),
    pytest.param({"dot": True}, id="tensor-cores"),  # the default: dp4a, row mix, subnormals
    pytest.param({"dot": True, "value_subnormals": False}, id="tensor-cores-value-levels"),
    pytest.param({"dot": True, "row_mix": False}, id="tensor-cores-mix-on-16-rows"),
    pytest.param(
        {"dot": True, "row_mix": False, "value_subnormals": False}, id="tensor-cores-dp4a-only"
    ),
    pytest.param({"dot": True, "whole_tiles": False}, id="tensor-cores-every-tile-masked"),
    pytest.param({"dot": True, "key_dp4a": False}, id="tensor-cores-key-words"),
    pytest.param({"dot": True, "key_dp4a": False, "key_words": False}, id="tensor-cores-key-bytes"),
    pytest.param({"dot": True, "unaligned_scales": True}, id="tensor-cores-scale-by-scale"),
    pytest.param({"dot": True, "unaligned_values": True}, id="tensor-cores-value-bytes"),
]


def _rows_one_wider(rows: torch.Tensor) -> torch.Tensor:
    """A device copy of ``rows`` whose rows lie one element wider apart than they are long."""
    padded = torch.empty(*rows.shape[:-1], rows.shape[-1] + 1, dtype=rows.dtype)
    moved = padded.to(DEVICE)[..., :-1]
    moved.copy_(rows)
    return moved


def _placed(scales: torch.Tensor, form: dict) -> torch.Tensor:
    """The scales on the device; for the ``unaligned_scales`` form a copy whose rows are a
    scale wider apart than they are long, which no row's scales as a word fit (the kernel
    loads them one by one)."""
    if not form.get("unaligned_scales"):
        return scales.to(DEVICE)
    moved = _rows_one_wider(scales)
    assert _scale_word_bits(moved) == 0
    return moved


def _placed_values(packed: torch.Tensor, form: dict) -> torch.Tensor:
    """The packed values on the device; for the ``unaligned_values`` form a copy whose rows
    are a byte wider apart than they are long (odd), which no 16-bit word fits (the kernel
    reads them byte by byte)."""
    if not form.get("unaligned_values"):
        return packed.to(DEVICE)
    moved = _rows_one_wider(packed)
    assert not _value_words_fit(moved, 2 * packed.shape[-1], 32)
    return moved


def _kernel_args(form: dict) -> dict:
    return {k: v for k, v in form.items() if k not in ("unaligned_scales", "unaligned_values")}


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("form", FORMS)
def test_kernel_equals_reference_on_filled_rows_of_a_strided_pool(form: dict) -> None:
    """Lengths on and around split edges, one layer of a pool, garbage past each fill
    (NaN scales: a row past the fill is never loaded)."""
    generator = torch.Generator().manual_seed(11)
    context = SPLIT_ROWS + 44
    (kp, ks), (vp, vs), _, _ = _int4_pool(generator, 6, 2, context, 64)
    lengths = torch.tensor([1, SPLIT_ROWS - 1, SPLIT_ROWS, SPLIT_ROWS + 1, context, 65])
    for slot, length in enumerate(lengths.tolist()):
        ks[:, slot, :, length:] = float("nan")
        vs[:, slot, :, length:] = float("inf")
    q = torch.randn(6, 2, 64, generator=generator)
    keys = (kp[1].to(DEVICE), _placed(ks[1], form))  # strided views of one layer
    values = (_placed_values(vp[1], form), _placed(vs[1], form))
    got = ring_attention_int4(q.to(DEVICE), keys, values, lengths.to(DEVICE), **_kernel_args(form))
    want = ring_attention_int4_reference(q.to(DEVICE), keys, values, lengths.to(DEVICE))
    assert bool(torch.isfinite(got).all())
    _assert_near(got, want, form["dot"])


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("form", FORMS)
def test_kernel_reads_the_slot_each_row_names(form: dict) -> None:
    generator = torch.Generator().manual_seed(12)
    (kp, ks), (vp, vs), _, _ = _int4_pool(generator, 5, 2, 96, 32)
    slots = torch.tensor([4, 0, 4, 2])
    lengths = torch.tensor([96, 3, 50, 17])
    q = torch.randn(4, 2, 32, generator=generator)
    keys = (kp[0].to(DEVICE), _placed(ks[0], form))
    values = (_placed_values(vp[0], form), _placed(vs[0], form))
    q, lengths, slots = q.to(DEVICE), lengths.to(DEVICE), slots.to(DEVICE)
    got = ring_attention_int4(q, keys, values, lengths, slots, block_rows=32, **_kernel_args(form))
    want = ring_attention_int4_reference(q, keys, values, lengths, slots)
    _assert_near(got, want, form["dot"])


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_kernel_reads_queries_in_place_from_a_projection() -> None:
    """q strided as a projection's third (no copy made), no slots (row b reads slot b)."""
    generator = torch.Generator().manual_seed(13)
    (kp, ks), (vp, vs), _, _ = _int4_pool(generator, 3, 2, 64, 32)
    q = torch.randn(3, 3, 2, 32, generator=generator).to(DEVICE).unbind(1)[2]
    assert not q.is_contiguous()
    keys, values = (kp[0].to(DEVICE), ks[0].to(DEVICE)), (vp[0].to(DEVICE), vs[0].to(DEVICE))
    lengths = torch.tensor([64, 5, 33], device=DEVICE)
    got = ring_attention_int4(q, keys, values, lengths, block_rows=32)
    copied = ring_attention_int4(q.contiguous(), keys, values, lengths, block_rows=32)
    assert torch.equal(got, copied)
    want = ring_attention_int4_reference(q, keys, values, lengths)
    _assert_near(got, want, dot=DEVICE.type == "cuda")


def test_int4_attention_stays_near_the_float_rings() -> None:
    """What 4 bits cost one attention read on random rows with sharp scores (keys x3): about
    a sixth of the output's norm, against about a fiftieth for fp8 (the model-level figures
    are bench/kv_precision.py's). A bound, so a broken quantizer (levels off by one, a
    swapped nibble) fails it."""
    generator = torch.Generator().manual_seed(13)
    (kp, ks), (vp, vs), keys, values = _int4_pool(generator, 4, 2, 300, 64)
    lengths = torch.tensor([300, 120, 7, 256])
    q = torch.randn(4, 2, 64, generator=generator)
    exact = ring_attention_reference(q, keys[0], values[0], lengths)
    approx = ring_attention_int4_reference(q, (kp[0], ks[0]), (vp[0], vs[0]), lengths)
    relative = float((approx - exact).norm() / exact.norm())
    fp8 = ring_attention_reference(
        q, keys[0].to(torch.float8_e4m3fn), values[0].to(torch.float8_e4m3fn), lengths
    )
    relative_fp8 = float((fp8 - exact).norm() / exact.norm())
    assert relative_fp8 < relative < 0.25


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_a_7b_head_row_reads_its_four_scales_as_one_word() -> None:
    """A 128-value head row has four scales: one 64-bit word (the 32- and 16-bit words are
    the other tests' 64- and 32-value heads); its values read as words, and as bytes where
    its rows start on odd bytes."""
    (kp, ks), (vp, vs), _, _ = _int4_pool(torch.Generator().manual_seed(17), 3, 1, 100, 128)
    assert _scale_word_bits(ks[1], vs[1]) == 64
    keys = (kp[1].to(DEVICE), ks[1].to(DEVICE))
    values = (vp[1].to(DEVICE), vs[1].to(DEVICE))
    q = torch.randn(3, 1, 128, generator=torch.Generator().manual_seed(18)).to(DEVICE)
    lengths = torch.tensor([100, 31, 64], device=DEVICE)
    want = ring_attention_int4_reference(q, keys, values, lengths)
    assert _value_words_fit(values[0], 128, 32)
    for form in ({}, {"unaligned_values": True}):
        placed = (_placed_values(vp[1], form), values[1])
        got = ring_attention_int4(q, keys, placed, lengths, dot=True, block_rows=32)
        _assert_near(got, want, True)


def test_values_read_as_words_only_where_every_row_starts_on_an_even_byte() -> None:
    """A word holds four values: the rows must start on even bytes, a group hold whole
    words, and a row at least 16 words (a product's columns)."""
    pool = torch.zeros(2, 3, 4, 10, 64, dtype=torch.uint8)  # layers, slots, heads, rows, bytes
    assert _value_words_fit(pool[1], 128, 32)
    assert not _value_words_fit(pool[1], 128, 2)  # a word would span two groups
    assert not _value_words_fit(pool[1, ..., :16], 32, 32)  # 8 words a row
    flat = torch.zeros(1 + pool[1].numel(), dtype=torch.uint8)
    assert not _value_words_fit(flat[1:].view(3, 4, 10, 64), 128, 32)  # starts on an odd byte
    odd = torch.zeros(3, 4, 10, 65, dtype=torch.uint8)[..., :64]
    assert not _value_words_fit(odd, 128, 32)  # rows 65 bytes apart


def test_scales_load_as_words_only_where_every_row_starts_on_one() -> None:
    """A row of four float16 scales is one 64-bit word, of two 32 bits, of one 16; a view
    whose rows do not start on a multiple of it (or a row with eight scales) loads the
    scales one by one."""
    pool = torch.zeros(2, 3, 4, 10, 4, dtype=torch.float16)  # layers, slots, heads, rows, groups
    assert _scale_word_bits(pool[1], pool[0]) == 64
    assert _scale_word_bits(pool[1, :, :, :, :2].contiguous()) == 32
    assert _scale_word_bits(pool[1, :, :, :, :1].contiguous()) == 16
    assert _scale_word_bits(pool[1, :, :, :, 1:3]) == 0  # rows 4 apart, 2 wide
    assert _scale_word_bits(torch.zeros(3, 4, 10, 8, dtype=torch.float16)) == 0
    flat = torch.zeros(1 + 3 * 4 * 10 * 4, dtype=torch.float16)
    assert _scale_word_bits(flat[1:].view(3, 4, 10, 4)) == 0  # starts 2 bytes in


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a register cap is ptxas's (CUDA)")
@pytest.mark.parametrize("stages", [3, 5])
def test_a_register_cap_and_more_stages_change_no_result(stages: int) -> None:
    """The tensor-core form compiled at 96 registers a thread (more programs an SM, spills at
    the default tiles) and 3 or 5 stages reads what the uncapped one reads."""
    generator = torch.Generator().manual_seed(14)
    context = 2 * SPLIT_ROWS + 9
    (kp, ks), (vp, vs), _, _ = _int4_pool(generator, 3, 2, context, 128)
    lengths = torch.tensor([context, SPLIT_ROWS + 3, 40], device=DEVICE)
    q = torch.randn(3, 2, 128, generator=generator).to(DEVICE)
    keys = (kp[0].to(DEVICE), ks[0].to(DEVICE))
    values = (vp[0].to(DEVICE), vs[0].to(DEVICE))
    plain = ring_attention_int4(q, keys, values, lengths, dot=True, max_registers=0)
    capped = ring_attention_int4(
        q, keys, values, lengths, dot=True, max_registers=96, num_stages=stages
    )
    torch.testing.assert_close(capped, plain, atol=1e-3, rtol=1e-3)
    want = ring_attention_int4_reference(q, keys, values, lengths)
    _assert_near(capped, want, dot=True)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_the_write_kernel_stores_what_the_quantizer_and_an_indexed_store_give() -> None:
    """Bit for bit: packed bytes and scales, a group of zeros (scale 0), values on a
    rounding tie (level 2.5 and -1.5: to even), a row past the clamp's reach, and a row the
    batch marks inactive, whose slot keeps what it held."""
    generator = torch.Generator().manual_seed(16)
    slots_n, heads, context, dim = 5, 3, 7, 128
    k = torch.randn(4, heads, dim, generator=generator) * 3
    v = torch.randn(4, heads, dim, generator=generator).to(torch.bfloat16)
    k[0, 0, :32] = 0.0  # a group of zeros
    k[1, 1, :32] = 0.0
    k[1, 1, 0], k[1, 1, 1], k[1, 1, 2] = 7.0, 2.5, -1.5  # scale 1: ties round to even
    slots = torch.tensor([3, 0, 4, 1])
    rows = torch.tensor([6, 0, 2, 2])
    active = torch.tensor([True, True, True, False])

    def pool() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        noise = torch.Generator().manual_seed(17)
        packed = torch.randint(0, 256, (2, slots_n, heads, context, dim // 2), generator=noise)
        scales = torch.randn(2, slots_n, heads, context, dim // GROUP, generator=noise)
        packed, scales = packed.to(torch.uint8), scales.to(torch.float16)
        return (packed[1], scales[1]), (packed[0].clone(), scales[0].clone())

    want_k, want_v = pool()
    for (store, scales), new in ((want_k, k), (want_v, v)):
        packed, scale = quantize_int4(new)
        keep = active[:, None, None]
        store[slots, :, rows] = torch.where(keep, packed, store[slots, :, rows])
        scales[slots, :, rows] = torch.where(keep, scale, scales[slots, :, rows])
    got_k, got_v = (tuple(t.to(DEVICE) for t in ring) for ring in pool())
    write_int4_rows(
        (got_k, got_v),
        (k.to(DEVICE), v.to(DEVICE)),
        slots.to(DEVICE),
        rows.to(DEVICE),
        active.to(DEVICE),
    )
    for got, want in zip((*got_k, *got_v), (*want_k, *want_v), strict=True):
        assert torch.equal(got.cpu(), want), (got.cpu() != want).nonzero()[:5]
    assert int(want_k[0][0, 1, 0, 0]) == 15 | (10 << 4)  # 7 and 2.5 -> levels 7, 2 (+8)
    assert int(want_k[0][0, 1, 0, 1]) & 15 == 6  # -1.5 -> -2 (+8)


def test_the_query_rounds_to_127_levels_a_group_within_half_a_step() -> None:
    """The query the keys' products take (`round_query`): each group's values on 255
    levels of its largest magnitude, at most half a level away, a group of zeros zeros,
    ties to even as the kernel's rounding."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(3, 2, 128, generator=generator) * 4
    q[0, 0, :GROUP] = 0.0
    q[1, 1, :GROUP] = torch.arange(GROUP) - 10.0  # levels on a step of 21/127: ties among them
    got = round_query(q)
    groups, rounded = q.reshape(3, 2, 4, GROUP), got.reshape(3, 2, 4, GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    assert bool(((rounded - groups).abs() <= step / 2 + 1e-6).all())
    levels = torch.where(step > 0, rounded / torch.where(step > 0, step, 1.0), 0.0)
    assert bool((levels - levels.round()).abs().max() < 1e-3)
    assert bool((levels.abs() <= 127 + 1e-3).all())
    assert bool((got[0, 0, :GROUP] == 0).all())
    with pytest.raises(ValueError, match="multiple"):
        round_query(torch.zeros(2, 40))
