"""The RMSNorm kernel against its torch reference, and the model's dispatch to it.

On a host without a GPU the kernel runs in Triton's interpreter (tests/conftest.py
sets ``TRITON_INTERPRET``); on CUDA the same tests run compiled, plus the 7B's
shape inside a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from duplex.kernels import rms_norm, rms_norm_reference, triton_available
from duplex.kernels.rms_norm import MAX_DIM, add_rms_norm, add_rms_norm_reference
from duplex.models.moshi import _layers
from duplex.models.moshi._layers import RMSNorm

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# float32: summation order only; bf16: one rounding flip of the cast back (1 ulp = 2^-7 relative)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _check(x: torch.Tensor, alpha: torch.Tensor, eps: float = 1e-8) -> None:
    got = rms_norm(x, alpha, eps)
    want = rms_norm_reference(x, alpha, eps)
    assert got.dtype == x.dtype and got.shape == x.shape and got.is_contiguous()
    tolerance = TOLERANCE[x.dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (3, 96), (2, 5, 128), (1, 1, 48), (7,)])
def test_kernel_equals_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """Rows of [B, dim] and [B, T, dim], B = 1, widths that are and are not powers of two."""
    generator = torch.Generator().manual_seed(sum(shape))
    x = (3 * torch.randn(shape, generator=generator)).to(dtype).to(DEVICE)
    alpha = torch.randn(1, 1, shape[-1], generator=generator).to(dtype).to(DEVICE)
    _check(x, alpha)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_reads_strided_views(dtype: torch.dtype) -> None:
    """A row slice of a wider buffer, a time-strided view, and a transposed (copied) one."""
    generator = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 3, 80, generator=generator).to(dtype).to(DEVICE)
    alpha = torch.randn(64, generator=generator).to(dtype).to(DEVICE)
    _check(wide[..., 8:72], alpha)  # rows strided by 80, last axis contiguous
    _check(wide[:, ::2, :64], alpha)  # leading axes that do not flatten: reshape copies
    square = torch.randn(64, 64, generator=generator).to(dtype).to(DEVICE)
    _check(square.t(), alpha)  # last axis strided: made contiguous


def test_kernel_keeps_float32_alpha_with_bf16_rows_and_a_large_eps() -> None:
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, 32, generator=generator).to(torch.bfloat16).to(DEVICE)
    alpha = torch.randn(1, 1, 32, generator=generator).to(DEVICE)
    _check(x, alpha, eps=0.5)
    zeros = torch.zeros(2, 32, device=DEVICE)
    _check(zeros, alpha, eps=1e-8)  # rsqrt(eps) stays finite: zeros stay zeros


def test_kernel_rejects_rows_wider_than_it_holds() -> None:
    x = torch.zeros(1, MAX_DIM + 1)
    with pytest.raises(ValueError, match="registers"):
        rms_norm(x, torch.ones(MAX_DIM + 1), 1e-8)


def test_module_keeps_the_torch_path_on_cpu_and_under_autograd() -> None:
    """On host tensors (and whenever autograd records) the module is the reference, bit for bit."""
    norm = RMSNorm(16, 1e-8)
    with torch.no_grad():
        norm.alpha.copy_(torch.linspace(0.5, 2.0, 16))
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(5))
    assert torch.equal(norm(x), rms_norm_reference(x, norm.alpha, 1e-8))
    assert norm(x).requires_grad  # alpha is a parameter: the graph is recorded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [4096, 1024, 96])
def test_the_residual_add_is_torchs_and_the_norm_reads_it(dtype: torch.dtype, dim: int) -> None:
    """The sum bit for bit torch's ``x + delta`` (one rounding); the norm the one-launch norm
    of that sum, bit for bit, and near the reference's."""
    generator = torch.Generator().manual_seed(dim)
    x = (3 * torch.randn(5, dim, generator=generator)).to(dtype).to(DEVICE)
    delta = torch.randn(5, dim, generator=generator).to(dtype).to(DEVICE)
    alpha = torch.randn(1, 1, dim, generator=generator).to(DEVICE)
    total, normed = add_rms_norm(x, delta, alpha, 1e-8)
    assert total.shape == normed.shape == x.shape and total.dtype == normed.dtype == dtype
    assert torch.equal(total, x + delta)
    assert torch.equal(normed, rms_norm(total, alpha, 1e-8))
    want_total, want_normed = add_rms_norm_reference(x, delta, alpha, 1e-8)
    assert torch.equal(want_total, x + delta)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(normed.float(), want_normed.float(), atol=tolerance, rtol=tolerance)


def test_the_residual_add_reads_strided_rows_and_refuses_mixed_operands() -> None:
    generator = torch.Generator().manual_seed(9)
    wide = torch.randn(4, 80, generator=generator).to(torch.bfloat16).to(DEVICE)
    delta = torch.randn(4, 64, generator=generator).to(torch.bfloat16).to(DEVICE)
    alpha = torch.ones(64, device=DEVICE)
    total, _ = add_rms_norm(wide[:, 8:72], delta, alpha, 1e-8)
    assert torch.equal(total, wide[:, 8:72] + delta)
    with pytest.raises(ValueError, match="one shape and dtype"):
        add_rms_norm(delta, delta.float(), alpha, 1e-8)
    with pytest.raises(ValueError, match="one shape and dtype"):
        add_rms_norm(delta, delta[:, :32], alpha, 1e-8)


def test_the_modules_residual_keeps_the_torch_path_on_cpu() -> None:
    norm = RMSNorm(16, 1e-8)
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(2, 3, 16, generator=generator)
    delta = torch.randn(2, 3, 16, generator=generator)
    total, normed = norm.residual(x, delta)
    assert torch.equal(total, x + delta) and torch.equal(normed, norm(x + delta))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dim", [4096, 1024])
def test_module_uses_the_kernel_at_the_7b_shape_inside_a_cuda_graph(
    dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 rows of the temporal (4096) and depth (1024) width, captured and replayed."""
    calls: list[int] = []

    def counted(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
        calls.append(x.shape[-1])
        return rms_norm(x, alpha, eps)

    monkeypatch.setattr(_layers, "rms_norm", counted)
    norm = RMSNorm(dim, 1e-8).to("cuda", torch.bfloat16).requires_grad_(False)
    generator = torch.Generator(device="cuda").manual_seed(6)
    with torch.no_grad():
        norm.alpha.copy_(torch.rand(1, 1, dim, generator=generator, device="cuda") + 0.5)
    x = torch.randn(16, dim, generator=generator, device="cuda").to(torch.bfloat16)
    norm(x)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        got = norm(x)
    assert calls == [dim, dim]
    for _ in range(2):  # replays read x's memory: new values give new rows
        x.copy_(torch.randn(16, dim, generator=generator, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        want = rms_norm_reference(x, norm.alpha, 1e-8)
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
