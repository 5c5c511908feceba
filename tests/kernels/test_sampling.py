"""The fused sampling kernel against its torch reference, token for token.

On a host without a GPU the kernel runs in Triton's interpreter (tests/conftest.py
sets ``TRITON_INTERPRET``); on CUDA the same tests run compiled, plus one inside a
CUDA graph. The statistics of the reference itself (softmax frequencies, top-k
support, slot isolation) are tested in tests/models/moshi/test_static_step.py.
"""

from __future__ import annotations

import pytest
import torch

from duplex.kernels import counter_uniform, sample, sample_reference, triton_available
from duplex.kernels.sampling import as_int64

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOP_KS = (0, 1, 5, 25, 250)


def _batch(
    generator: torch.Generator, rows: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits at Moshi's scale, mixed greedy / sampled rows, ``[rows, 2]`` parameter columns."""
    logits = 4 * torch.randn(rows, vocab, generator=generator)
    temperature = torch.rand(rows, 2, generator=generator) * 1.5
    temperature[::3] = 0.0  # every third row greedy
    pick = torch.randint(0, len(TOP_KS), (rows, 2), generator=generator)
    top_k = torch.tensor(TOP_KS)[pick]
    seeds = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=generator)
    frames = torch.randint(0, 1 << 40, (rows,), generator=generator)
    return (
        logits.to(DEVICE),
        temperature.to(DEVICE),
        top_k.to(DEVICE),
        seeds.to(DEVICE),
        frames.to(DEVICE),
    )


def _both(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    seeds: torch.Tensor,
    frames: torch.Tensor,
    stream: int,
    cap: int,
) -> tuple[list[int], list[int]]:
    args = (logits, temperature, top_k, seeds, frames, stream, cap)
    got = sample(*args)
    assert got.dtype == torch.int64 and got.shape == (logits.shape[0],)
    return got.tolist(), sample_reference(*args).tolist()


if triton_available():
    import triton
    import triton.language as tl

    from duplex.kernels.sampling import _row_key, _uniform

    @triton.jit
    def _uniforms(seed_ptr, frame_ptr, out_ptr, vocab, STREAM: tl.constexpr, BLOCK: tl.constexpr):
        """The kernel's noise for one row, written out (only the test needs it in memory).

        ``STREAM`` is a constexpr here, as Triton makes an int argument equal to 1.
        """
        row = tl.program_id(0)
        key = _row_key(tl.load(seed_ptr + row), tl.load(frame_ptr + row), STREAM)
        offsets = tl.arange(0, BLOCK)
        tl.store(out_ptr + row * vocab + offsets, _uniform(key, offsets), mask=offsets < vocab)


@pytest.mark.parametrize("stream", [0, 1, 8])
def test_kernel_noise_is_bit_equal_to_counter_uniform(stream: int) -> None:
    """uint64 hashing in Triton gives counter_uniform's floats bit for bit, edge seeds too."""
    extremes = [0, 1, -1, 2**63 - 1, -(2**63), as_int64(0x0123456789ABCDEF)]
    generator = torch.Generator().manual_seed(stream)
    seeds = torch.tensor([*extremes, 5, 5])
    frames = torch.tensor([0, 1, 2**62, 7, -3, 2**40 + 1, 0, 1])
    seeds = torch.cat([seeds, torch.randint(-(2**63), 2**63 - 1, (4,), generator=generator)])
    frames = torch.cat([frames, torch.randint(0, 1 << 50, (4,), generator=generator)])
    seeds, frames = seeds.to(DEVICE), frames.to(DEVICE)
    vocab = 1000
    got = torch.empty(len(seeds), vocab, device=DEVICE)
    _uniforms[(len(seeds),)](seeds, frames, got, vocab, STREAM=stream, BLOCK=1024)
    want = counter_uniform(seeds, frames, stream, vocab)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize(
    ("vocab", "rows", "seed"),
    [(1000, 12, 0), (1000, 12, 1), (2048, 12, 2), (2048, 12, 3), (32000, 4, 4), (32000, 4, 5)],
)
def test_kernel_equals_reference(vocab: int, rows: int, seed: int) -> None:
    """Same tokens on a text and an audio stream, strided parameter columns, both caps."""
    generator = torch.Generator().manual_seed(seed)
    logits, temperature, top_k, seeds, frames = _batch(generator, rows, vocab)
    # column 0 under a cap of 250 (top_k 0 means 250), column 1 under the whole vocabulary
    for stream, column, cap in ((0, 0, 250), (3, 1, vocab)):
        got, want = _both(
            logits, temperature[:, column], top_k[:, column], seeds, frames, stream, cap
        )
        assert got == want, (stream, cap)


def test_ties_at_the_kth_value_are_kept_and_greedy_takes_the_first_max() -> None:
    """Integer-valued logits tie everywhere: the kept set and the argmax follow torch."""
    generator = torch.Generator().manual_seed(6)
    rows, vocab = 12, 300
    logits = torch.randint(-3, 4, (rows, vocab), generator=generator).float()
    logits[0] = 0.0
    logits[0, 7:9] = -0.0  # -0.0 == 0.0: a tie, not a smaller value
    logits[1, :] = float("-inf")
    logits[2, ::2] = float("-inf")
    temperature = torch.tensor([0.0, 0.0, 0.9] + [1.0] * 9)
    top_k = torch.tensor([0, 0, 5, 1, 5, 5, 25, 25, 1, 300, 0, 2])
    seeds = torch.arange(rows) * 1000
    tensors = [t.to(DEVICE) for t in (logits, temperature, top_k, seeds)]
    logits, temperature, top_k, seeds = tensors
    greedy = logits.argmax(-1)
    for frame in range(3):
        frames = torch.full((rows,), frame, device=DEVICE)
        got, want = _both(logits, temperature, top_k, seeds, frames, 2, vocab)
        assert got == want
        assert got[:2] == greedy[:2].tolist() == [0, 0]
        for index in range(2, rows):
            k = int(top_k[index]) or vocab
            kth = logits[index].topk(k).values[-1]
            assert logits[index, got[index]] >= kth  # ties at the k-th value may win


def test_rows_are_independent_of_the_batch_and_of_logits_layout() -> None:
    """A row alone, or read from a wider (row-strided) buffer, gives the same token."""
    generator = torch.Generator().manual_seed(7)
    logits, temperature, top_k, seeds, frames = _batch(generator, 5, 1000)
    wide = torch.zeros(5, 1100, device=DEVICE)
    wide[:, :1000] = logits
    batch = sample(wide[:, :1000], temperature[:, 0], top_k[:, 0], seeds, frames, 1, 250)
    for index in range(5):
        alone = sample(
            logits[index : index + 1],
            temperature[index : index + 1, 0],
            top_k[index : index + 1, 0],
            seeds[index : index + 1],
            frames[index : index + 1],
            1,
            250,
        )
        assert int(alone) == int(batch[index])


def test_nan_rows_give_an_in_range_token_and_leave_other_rows_alone() -> None:
    """Discarded prefix rows may hold NaN; their token still indexes an embedding safely."""
    generator = torch.Generator().manual_seed(8)
    logits, temperature, top_k, seeds, frames = _batch(generator, 4, 2048)
    clean = sample(logits, temperature[:, 1], top_k[:, 1], seeds, frames, 0, 250)
    logits[1] = float("nan")
    logits[2, ::3] = float("nan")
    dirty = sample(logits, temperature[:, 1], top_k[:, 1], seeds, frames, 0, 250)
    assert bool(((dirty >= 0) & (dirty < 2048)).all())
    assert dirty[[0, 3]].tolist() == clean[[0, 3]].tolist()


def test_kernel_rejects_logits_it_cannot_read() -> None:
    one = torch.ones(1, dtype=torch.long, device=DEVICE)
    logits = torch.zeros(1, 8, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="float32"):
        sample(logits, one.float(), one, one, one, 0, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_inside_a_cuda_graph() -> None:
    """Captured once, replayed on new logits and frame counters written in place."""
    generator = torch.Generator().manual_seed(9)
    logits, temperature, top_k, seeds, frames = _batch(generator, 16, 32000)
    args = (logits, temperature[:, 0], top_k[:, 0], seeds, frames, 0, 250)
    sample(*args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = sample(*args)
    for step in range(3):
        logits.copy_(4 * torch.randn(logits.shape, generator=generator).to(DEVICE))
        frames.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        assert got.tolist() == sample_reference(*args).tolist(), step
