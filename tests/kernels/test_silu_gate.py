"""The gated FFN's SiLU and product in one kernel (and quantized to e4m3 in it) against torch.

On CUDA the kernel must give torch's bits (libdevice's ``expf``, as torch's SiLU). On a host
without a GPU it runs in Triton's interpreter with numpy's ``exp``, which torch's CPU SiLU
can differ from by a float32 ulp: there a bfloat16 result may be one rounding step off, rarely.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from duplex.kernels import triton_available
from duplex.kernels.fp8_rows import quantize_rows_e4m3_reference
from duplex.kernels.silu_gate import (
    MAX_DIM,
    silu_gate,
    silu_gate_e4m3,
    silu_gate_e4m3_reference,
    silu_gate_reference,
)
from duplex.models.moshi._fp8 import FP8_EPS, Fp8Linear
from duplex.models.moshi._layers import GatedFFN

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def _rows(batch: int, hidden: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``[gate; value]`` rows with gates far into both tails and exact zeros."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(batch, 2 * hidden, generator=generator) * 4
    rows[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp overflows; silu(0) = 0
    rows[-1] = 0.0
    return rows.to(dtype).to(DEVICE)


def _assert_torchs(got: torch.Tensor, want: torch.Tensor) -> None:
    if DEVICE.type == "cuda":
        assert torch.equal(got, want)
        return
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        return
    differ = got != want
    assert float(differ.float().mean()) < 1e-3  # a rounding step, seldom
    torch.testing.assert_close(got.float(), want.float(), atol=0, rtol=2**-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [11264, 2816, 48])
def test_the_kernel_gives_torchs_silu_times_value(dtype: torch.dtype, hidden: int) -> None:
    """The 7B's temporal (11264: no power of two, a masked tail) and depth widths, a small one."""
    rows = _rows(5, hidden, hidden, dtype)
    got = silu_gate(rows)
    assert got.shape == (5, hidden) and got.dtype == dtype and got.is_contiguous()
    gate, value = rows[:, :hidden], rows[:, hidden:]
    _assert_torchs(got, F.silu(gate) * value)
    assert torch.equal(silu_gate_reference(rows), F.silu(gate) * value)
    assert not bool(got[-1].any())  # zero rows stay zero


def test_leading_axes_and_strided_rows_are_read() -> None:
    rows = _rows(6, 64, 3, torch.bfloat16)
    batched = rows.view(2, 3, 128)
    assert torch.equal(silu_gate(batched), silu_gate(rows).view(2, 3, 64))
    wide = torch.zeros(6, 200, dtype=torch.bfloat16, device=DEVICE)
    wide[:, 8:136] = rows
    assert torch.equal(silu_gate(wide[:, 8:136]), silu_gate(rows))


@pytest.mark.parametrize("hidden", [11264, 2816])
def test_the_quantized_form_is_the_product_quantized(hidden: int) -> None:
    """Values and scales equal `quantize_rows_e4m3_reference` of the kernel's own product, bit
    for bit. The reference runs on the host: its true division by 448 is the kernel's, where
    torch's CUDA division by a Python scalar multiplies by its reciprocal (an ulp apart, and
    then a tie between two e4m3 levels goes the other way)."""
    rows = _rows(4, hidden, hidden + 1, torch.bfloat16)
    values, scale = silu_gate_e4m3(rows, FP8_EPS)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (4, 1)
    want_values, want_scale = quantize_rows_e4m3_reference(silu_gate(rows).cpu(), FP8_EPS)
    assert torch.equal(scale.cpu(), want_scale)
    assert torch.equal(values.cpu().view(torch.uint8), want_values.view(torch.uint8))
    assert float(scale[-1]) == pytest.approx(FP8_EPS / 448)  # a zero row: the floor
    reference_values, _ = silu_gate_e4m3_reference(rows.cpu(), FP8_EPS)  # torch's CPU SiLU
    assert float((reference_values.float() - want_values.float()).abs().max()) <= 32.0


def test_shapes_and_dtypes_it_cannot_take_are_refused() -> None:
    with pytest.raises(ValueError, match="even width"):
        silu_gate(torch.zeros(2, 7, device=DEVICE))
    with pytest.raises(ValueError, match="registers"):
        silu_gate(torch.zeros(1, 2 * MAX_DIM + 2, device=DEVICE))
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        silu_gate(torch.zeros(2, 8, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[M, 2 \* hidden\]"):
        silu_gate_e4m3(torch.zeros(2, 2, 8, device=DEVICE), FP8_EPS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-weights", "fp8-weights"])
def test_the_ffn_on_cuda_gives_the_unfused_bits(fp8: bool) -> None:
    """`GatedFFN` at the 7B's depth width: the fused launch(es) against the torch composition
    its CPU path is (with fp8 weights: the SiLU product quantized by the fused kernel against
    `Fp8Linear`'s own quantization of the same product)."""
    torch.manual_seed(5)
    ffn = GatedFFN(1024, 2816).to("cuda", torch.bfloat16).requires_grad_(False)
    if fp8:
        ffn.to_fp8()
    x = torch.randn(16, 1024, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        got = ffn(x)
        want = ffn.linear_out(silu_gate_reference(ffn.linear_in(x)))
    assert isinstance(ffn.linear_out, Fp8Linear) == fp8
    assert torch.equal(got, want)
