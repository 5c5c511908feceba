"""`MimiStreams`' static, capturable frame (CPU: the eager run of what CUDA graphs capture).

Oracles:

- The frame math with no pool at all: `MimiModel.encode_frames` /
  `decode_frames` on a fresh `ConvState` and a private one-slot KV ring per
  session (the streaming path before slots were static). Bucket padding,
  slot reuse and staggered joins must not change codes (exact) or PCM
  (within float rounding of a different batch make-up, 1e-5).
- A twin pool whose scratch slot is clean: garbage (NaN) in the scratch rows
  must not reach any real slot, bit for bit, and the frame leaves the
  scratch slot fresh.
- The meta device: the frame runs with every tensor on ``meta`` and no op
  sees a host tensor or reads a value (``.item()`` cannot run on meta), so
  capture cannot meet a host sync or a host-to-device copy.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from duplex.models.moshi import MimiModel, MimiStreams, cast_mimi, mimi_preset, random_mimi
from duplex.models.moshi._mimi import KVRingView
from duplex.models.moshi._seanet import ConvState

TINY = mimi_preset("tiny")
FRAME = TINY.frame_size


@pytest.fixture(scope="module")
def tiny() -> MimiModel:
    return random_mimi(TINY, seed=3)


def signal(frames: int, seed: int) -> torch.Tensor:
    """``[frames, FRAME]`` noisy sine."""
    generator = torch.Generator().manual_seed(seed)
    t = torch.arange(frames * FRAME) / TINY.sample_rate
    tone = 0.5 * torch.sin(2 * torch.pi * (180 + 40 * seed) * t)
    return (tone + 0.1 * torch.randn(frames * FRAME, generator=generator)).view(frames, FRAME)


def random_codes(frames: int, seed: int) -> torch.Tensor:
    """``[frames, num_codebooks]`` codes."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY.bins, (frames, TINY.num_codebooks), generator=generator)


def direct(
    model: MimiModel, pcm: torch.Tensor, codes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One session through the frame math, private state: codes ``[T, K]``, PCM ``[T, FRAME]``."""
    config = model.config
    ring = (config.transformer_layers, 1, config.transformer_heads, config.context, config.head_dim)
    slot = torch.zeros(1, dtype=torch.long)
    outputs = []
    for layers, inputs, run in (
        (model.encoder_convs, pcm[:, None, None], model.encode_frames),
        (model.decoder_convs, codes[:, None, :, None], model.decode_frames),
    ):
        state = ConvState.fresh(layers, 1, device=pcm.device, dtype=pcm.dtype)
        keys, values = torch.zeros(ring), torch.zeros(ring)
        frames = []
        for n, x in enumerate(inputs):
            state = ConvState(state.buffers, torch.tensor([n == 0]))
            view = KVRingView(keys, values, slot, torch.tensor([n * config.latent_steps]))
            extra = (TINY.num_codebooks,) if run == model.encode_frames else ()
            with torch.no_grad():
                frames.append(run(x, state, view, *extra)[0])  # type: ignore[operator]
        outputs.append(torch.stack(frames))
    return outputs[0][..., 0], outputs[1][:, 0]


def test_joins_resets_and_padding_equal_the_direct_frame_math(tiny: MimiModel) -> None:
    # (slot, first tick, frames, decode delay): F reuses slot 0 while B and E stream on;
    # batches of 1..5 rows run in buckets 1, 2, 4 and 5 (padded by the scratch slot).
    sessions = {
        "A": (0, 0, 5, 0),
        "B": (1, 0, 13, 2),
        "C": (4, 1, 6, 1),
        "D": (2, 2, 3, 0),
        "E": (3, 3, 9, 3),
        "F": (0, 6, 7, 2),
    }
    pcm = {n: signal(s[2], seed=ord(n)) for n, s in sessions.items()}
    codes = {n: random_codes(s[2], seed=ord(n)) for n, s in sessions.items()}
    streams = MimiStreams(tiny, max_slots=5)
    assert [streams.bucket_for(b) for b in range(1, 6)] == [1, 2, 4, 4, 5]
    got: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {n: ([], []) for n in sessions}
    for tick in range(13):
        live = []
        for name, (slot, start, frames, _) in sessions.items():
            if tick == start:
                streams.reset_slot(slot)
            if start <= tick < start + frames:
                live.append(name)
        if not live:
            continue
        live.sort(key=lambda n: -ord(n) * (tick % 2) + ord(n))  # row order changes by tick
        slots = [sessions[n][0] for n in live]
        index = [tick - sessions[n][1] for n in live]
        encoded = streams.encode(
            slots, torch.stack([pcm[n][f] for n, f in zip(live, index, strict=True)])
        )
        for row, name in enumerate(live):
            got[name][0].append(encoded[row])
        # Decode starts `delay` ticks after encode (the engine's LM warm-up) and runs
        # the frames from 0 on.
        late = [
            (n, f - sessions[n][3]) for n, f in zip(live, index, strict=True) if f >= sessions[n][3]
        ]
        if late:
            frame_codes = torch.stack([codes[n][f] for n, f in late])
            decoded = streams.decode([sessions[n][0] for n, _ in late], frame_codes)
            for row, (name, _) in enumerate(late):
                got[name][1].append(decoded[row])
    assert streams.frames(1) == (13, 11)
    for name, (_, _, frames, delay) in sessions.items():
        want_codes, want_pcm = direct(tiny, pcm[name], codes[name][: frames - delay])
        assert torch.equal(torch.stack(got[name][0]), want_codes), name
        torch.testing.assert_close(torch.stack(got[name][1]), want_pcm, rtol=0, atol=1e-5)


def test_padding_rows_touch_only_the_scratch_slot(tiny: MimiModel) -> None:
    streams = MimiStreams(tiny, max_slots=4)
    pcm, codes = signal(4, seed=5).view(4, 1, FRAME), random_codes(4, seed=5)
    for n in range(3):
        streams.encode([0, 1, 2, 3], pcm[n].expand(4, FRAME))
        streams.decode([3, 2, 1, 0], codes[n].expand(4, -1))
    clean = copy.deepcopy(streams)
    directions = (streams._encode, streams._decode)
    scratch = streams.max_slots
    for direction in directions:  # garbage a padding row would pick up if it leaked
        direction.convs[scratch] = float("nan")
        direction.keys[:, scratch] = float("nan")
        direction.values[:, scratch] = float("inf")
        direction.frames[scratch] = 7
    before = [(d.convs.clone(), d.keys.clone(), d.frames.clone()) for d in directions]
    three = torch.stack([pcm[3, 0], -pcm[3, 0], 0.5 * pcm[3, 0]])
    assert streams.bucket_for(3) == 4  # one padding row
    got = streams.encode([2, 0, 3], three), streams.decode([3, 2, 0], codes[:3])
    want = clean.encode([2, 0, 3], three), clean.decode([3, 2, 0], codes[:3])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.isfinite(got[1]).all()
    for direction, twin, (convs, keys, frames) in zip(
        directions, (clean._encode, clean._decode), before, strict=True
    ):
        assert torch.equal(direction.convs[:scratch], twin.convs[:scratch])
        assert torch.equal(direction.keys[:, :scratch], twin.keys[:, :scratch])
        assert torch.equal(direction.frames[:scratch], twin.frames[:scratch])
        assert torch.equal(direction.convs[1], convs[1])  # slot 1 was not listed
        assert torch.equal(direction.keys[:, 1], keys[:, 1])
        assert int(direction.frames[1]) == int(frames[1]) == 3
        assert not direction.convs[scratch].any() and int(direction.frames[scratch]) == 0
    assert streams.frames(1) == (3, 3) and streams.frames(0) == (4, 4)


class _HostSpy(TorchDispatchMode):
    """Records ops that see a non-meta tensor or read a value back to the host."""

    READS = ("_local_scalar_dense", "nonzero", "item", "is_nonzero", "equal")

    def __init__(self) -> None:
        super().__init__()
        self.bad: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        if any(f"aten.{read}." in name for read in self.READS):
            self.bad.append(name)
        out = func(*args, **kwargs)
        for value in tree_flatten((args, kwargs, out))[0]:
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                self.bad.append(f"{name} on {value.device}")
        return out


def test_the_captured_frame_has_no_host_reads_or_copies() -> None:
    model = random_mimi(TINY, seed=1).to("meta")
    streams = MimiStreams(model, max_slots=3)
    for kind, width, frame, shape in (
        ("encode", FRAME, streams._encode_frame, (4, TINY.num_codebooks, 1)),
        ("decode", TINY.num_codebooks, streams._decode_frame, (4, 1, FRAME)),
    ):
        bucket = streams._bucket(kind, 4, width)
        with _HostSpy() as spy, torch.no_grad():
            out = frame(bucket)
        assert spy.bad == [], kind
        assert tuple(out.shape) == shape and out.device.type == "meta"


def test_cuda_graph_option(tiny: MimiModel) -> None:
    streams = MimiStreams(tiny, max_slots=6)
    assert not streams.use_graphs and streams.captured == 0
    assert [streams.bucket_for(b) for b in (1, 2, 3, 5, 6)] == [1, 2, 4, 6, 6]
    with pytest.raises(ValueError, match="CUDA"):
        MimiStreams(tiny, max_slots=1, cuda_graphs=True)
    assert not MimiStreams(tiny, max_slots=1, cuda_graphs=False).use_graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ring_kernel", [False, True], ids=["gathered", "ring-kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_graphed_frames_equal_eager_frames_on_cuda(
    tiny: MimiModel, dtype: torch.dtype, ring_kernel: bool
) -> None:
    """In either codec dtype (``codec_dtype``), and with the transformers' attention
    gathered or read in place (``ring_kernel``), the captured graphs replay the eager frame."""
    model = cast_mimi(copy.deepcopy(tiny).cuda(), dtype)
    eager = MimiStreams(model, max_slots=4, cuda_graphs=False, ring_kernel=ring_kernel)
    graphed = MimiStreams(model, max_slots=4, cuda_graphs=True, ring_kernel=ring_kernel)
    pcm, codes = signal(8, seed=2).cuda(), random_codes(8, seed=2).cuda()
    for n in range(8):
        slots = [s for s in range(4) if s <= n][::-1]
        if n == 5:
            eager.reset_slot(1)
            graphed.reset_slot(1)
        batch = torch.stack([pcm[n] * (1 + s) for s in slots])
        frame_codes = codes[n].expand(len(slots), -1)
        assert torch.equal(graphed.encode(slots, batch), eager.encode(slots, batch))
        torch.testing.assert_close(
            graphed.decode(slots, frame_codes).float(),
            eager.decode(slots, frame_codes).float(),
            rtol=0,
            atol=1e-4 if dtype == torch.float32 else 1e-2,
        )
    assert graphed.captured == 6  # encode and decode in buckets 1, 2 and 4
