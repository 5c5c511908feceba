"""fp8 weights (``weight_dtype = "fp8"``): e4m3 values with a float32 scale a row.

Oracles: e4m3's own rounding bound (3 mantissa bits: a value keeps its first 4 significant
bits, so a normal value moves by at most 1/16 of itself; below e4m3's normal range by at
most half its smallest step, 2^-10 of the row scale); the float32 product of the
dequantized operands, which is what the CPU path computes and what ``torch._scaled_mm``
computes on a GPU up to the order of its sums (checked against each other there); and the
float32 LM, which the fp8 one must stay near.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.kernels.fp8_rows import E4M3_MAX
from duplex.models.moshi import KVRing, moshi_preset, random_lm
from duplex.models.moshi._fp8 import (
    E4M3,
    Fp8Linear,
    fp8_linear,
    probe_tensor_cores,
    quantize_rows,
    scaled_product,
)

TINY = moshi_preset("tiny")


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 24),
    cols=st.integers(1, 48),
    seed=st.integers(0, 2**16),
    spread=st.floats(1e-3, 1e3),
)
def test_quantized_rows_stay_within_e4m3_rounding(
    rows: int, cols: int, seed: int, spread: float
) -> None:
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(rows, cols, generator=generator) * spread
    matrix[0, 0] = 0.0  # zeros stay zeros
    values, scale = quantize_rows(matrix)
    assert values.dtype == E4M3 and scale.dtype == torch.float32 and scale.shape == (rows,)
    back = values.float() * scale[:, None]
    bound = torch.maximum(matrix.abs() / 16, scale[:, None] * 2**-10) * 1.0001
    assert bool(((back - matrix).abs() <= bound).all())
    assert back[0, 0] == 0.0
    nonzero = matrix.abs().amax(dim=1) > 0
    peaks = values.float().abs().amax(dim=1)
    assert torch.equal(peaks[nonzero], torch.full_like(peaks[nonzero], E4M3_MAX))


def test_an_all_zero_row_has_a_finite_scale_and_gives_zeros() -> None:
    values, scale = quantize_rows(torch.zeros(2, 8))
    assert bool(torch.isfinite(scale).all()) and not values.float().any()
    assert not fp8_linear(torch.randn(3, 8), values, scale).any()


def test_the_product_is_the_float32_product_of_the_quantized_operands() -> None:
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(40, 24, generator=generator)
    x = torch.randn(2, 5, 24, generator=generator) * 3
    layer = Fp8Linear(weight)
    out = layer(x)
    assert out.shape == (2, 5, 40) and out.dtype == torch.float32
    flat = x.reshape(-1, 24)
    x_values, x_scale = quantize_rows(flat)
    want = (x_values.float() * x_scale[:, None]) @ (layer.weight.float() * layer.scale[:, None]).T
    torch.testing.assert_close(out.reshape(-1, 40), want, rtol=1e-6, atol=1e-6)
    exact = x @ weight.T
    assert float((out - exact).norm() / exact.norm()) < 0.08  # both operands rounded
    # a block of rows (one depth step of stacked weights) is its own quantized matrix
    torch.testing.assert_close(layer.rows(x, 8, 16), out[..., 8:16], rtol=1e-6, atol=1e-5)


def test_the_tensor_core_call_computes_the_emulated_product() -> None:
    """`scaled_product` is the GPU's one ``torch._scaled_mm``; torch's CPU build runs the
    same call, so its operand layout and scales are checked here against the emulation
    (to bf16's rounding)."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 64, generator=generator)
    values, scale = quantize_rows(weight)
    x = torch.randn(7, 64, generator=generator) * 2
    x_values, x_scale = quantize_rows(x)
    try:
        got = scaled_product(x_values, x_scale[:, None], values, scale, torch.bfloat16)
    except (RuntimeError, NotImplementedError) as exc:  # a torch without it on the CPU
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {exc}")
    assert got.dtype == torch.bfloat16 and got.shape == (7, 48)
    assert probe_tensor_cores(torch.device("cpu")) is None  # the start-up probe, here
    want = fp8_linear(x, values, scale)  # float32: the emulated path
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=2e-2)


def temporal_logits(model: torch.nn.Module, frames: int) -> torch.Tensor:
    """Text logits ``[frames, text_card]`` of teacher-forced random columns."""
    ring = KVRing(
        num_layers=TINY.num_layers,
        max_slots=1,
        num_heads=TINY.num_heads,
        context=TINY.context,
        head_dim=TINY.head_dim,
        device="cpu",
        dtype=torch.float32,
    )
    generator = torch.Generator().manual_seed(11)
    high = torch.tensor([TINY.text_card, *([TINY.card] * TINY.n_q)])
    columns = (torch.rand(frames, TINY.num_streams, generator=generator) * high).long()
    slots = torch.zeros(1, dtype=torch.long)
    rows = []
    with torch.no_grad():
        for frame in range(frames):
            at = torch.tensor([frame])
            column = columns[frame : frame + 1]
            _, text = model.temporal_step(column, ring, slots, at, min(frame + 1, TINY.context))
            rows.append(text[0])
    return torch.stack(rows)


def test_the_temporal_transformer_in_fp8_drops_its_originals_and_stays_near_float32() -> None:
    """Measured on this seed over 80 frames (the ring wraps at 64): KL 3e-3 a frame, the
    greedy text token equal on 84% (docs/benchmarks.md has the bench's figures)."""
    full, fp8 = random_lm(TINY, 0), random_lm(TINY, 0)
    fp8.temporal_to_fp8()
    names = {n for n, _ in fp8.named_parameters()}
    assert not {n for n in names if n.startswith("transformer.") and "norm" not in n}
    assert "depformer.layers.0.self_attn.in_proj_weight" in names  # the depth one stays
    buffers = dict(fp8.named_buffers())
    assert buffers["transformer.layers.1.gating.linear_in.weight"].dtype == E4M3
    assert buffers["transformer.layers.1.self_attn.in_fp8.scale"].shape == (3 * TINY.dim,)
    want, got = temporal_logits(full, 80), temporal_logits(fp8, 80)
    p, q = torch.log_softmax(want, -1), torch.log_softmax(got, -1)
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    agree = float((want.argmax(-1) == got.argmax(-1)).float().mean())
    assert 0 < kl < 0.02 and agree >= 0.7, (kl, agree)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_tensor_core_product_matches_the_emulation_on_cuda() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no fp8 tensor cores")
    assert probe_tensor_cores(torch.device("cuda")) is None  # what the server checks at start
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(256, 128, generator=generator).cuda()
    layer = Fp8Linear(weight)
    for batch in (1, 7, 128):
        x = torch.randn(batch, 128, generator=generator).cuda().bfloat16()
        got = layer(x)
        assert got.dtype == torch.bfloat16
        # float32 takes the emulation; from the same bf16 values, so both quantize alike
        # (a float32 x rounds to other e4m3 levels than its bf16 copy: a level is 1/16)
        emulated = fp8_linear(x.float(), layer.weight, layer.scale)
        torch.testing.assert_close(got.float(), emulated, rtol=2e-2, atol=2e-2)
