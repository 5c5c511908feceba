"""Record a parity fixture of Kyutai's reference Moshi LM (``moshi==0.2.13``) for our LM.

What it does:

1. Maps one of our `MoshiConfig` presets (default ``tiny``) field by field onto
   the reference ``LMModel`` keyword arguments (the ``moshi_7b_202409`` layout:
   RoPE, ``rms_norm_f32``, SiLU gating, multi-linear depformer with weights per
   step) and checks every field has a reference meaning; a config the reference
   loop cannot express (PersonaPlex: ``user_lag`` 1, ``dep_q`` 16 with 8 agent
   codebooks, which needs NVIDIA's forked ``LMGen``) is refused with the reason.
2. Builds the reference model with seeded random weights (normal, std
   ``1/sqrt(fan_in)``, RMSNorm gains ``1 + 0.1 N(0, 1)``, rounded to bf16 so
   the file is small and both sides see the same float32 values), writes them
   under the official checkpoint names (``in_proj_weight`` / ``out_proj.weight``
   stacked over depth steps) and reloads the model *from that file* through the
   reference loader, so the file is proven loadable by both implementations.
3. Runs the reference ``LMGen`` streaming loop, greedy (``use_sampling=False``,
   ``check=True``), batch 1, for two sessions of ``--frames`` frames on seeded
   random user codes in ``[0, card)``, and records per frame exactly what
   ``LMGen.step`` returned: ``None`` during the ``max_delay`` warm-up frames
   (stored as ``-2`` with ``returned == False``), else the de-delayed text token
   and ``dep_q`` audio tokens. Also recorded: the undelayed tokens chosen in
   each frame (the reference's ``on_text_hook`` / ``on_audio_hook``), every
   logit row a greedy choice was made on (text, then each depth step), and the
   smallest top-1/top-2 gap among them, which says how far float rounding
   differences between the two implementations are from flipping an argmax.

Regenerate (from the repository root, with ``path/to/moshi-ref`` a folder holding the
``moshi`` package of ``moshi==0.2.13``; never import ``moshi.server``)::

    PYTHONPATH=path/to/moshi-ref .venv/bin/python tools/moshi_parity.py \\
        --out tests/fixtures/moshi_tiny

Outputs in ``--out``: ``lm.safetensors`` (bf16 weights, official names),
``trace.npz`` (``user_codes_a/b [T, user_q]``, ``text_a/b [T]``, ``audio_a/b
[T, dep_q]``, ``returned_a/b [T]``, ``sampled_text_a/b [T]``,
``sampled_audio_a/b [T, dep_q]``, float32 ``text_logits_a/b [T, text_card]``
and ``depth_logits_a/b [T, dep_q, card]``) and ``meta.json`` (preset, seeds,
versions, the reference kwargs, margin). ``tests/models/moshi/test_parity.py``
loads the weights with our `load_lm`, runs our `MoshiRunner` greedy on the same
codes (both sessions at once, in different slots and staggered frames) and
requires equal tokens frame by frame; it also compares our logits, teacher
forced on the reference's tokens, with the recorded ones.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before moshi is imported: plain eager ops
os.environ.setdefault("NO_CUDA_GRAPH", "1")

import numpy as np
import torch
from reference_configs import UnsupportedByReference, reference_kwargs
from safetensors.torch import load_file, save_file

from duplex.models.moshi import MoshiConfig, moshi_preset

REFERENCE_VERSION = "0.2.13"
SESSIONS = {"a": 1001, "b": 1002}  # session name -> user-code seed


def _check_shapes(model: torch.nn.Module, config: MoshiConfig) -> None:
    """The reference layers have our widths (catches a wrong feed-forward mapping)."""
    layer = model.transformer.layers[0]
    assert layer.gating.linear_out.in_features == config.ffn_hidden
    depth = model.depformer.layers[0]
    assert depth.gating[0].linear_out.in_features == config.depformer_ffn_hidden
    assert len(depth.gating) == config.dep_q == len(model.linears)


def random_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded, non-degenerate random weights, rounded to bf16 (std ``1/sqrt(fan_in)``)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(".alpha"):
                value = 1.0 + 0.1 * noise
            else:
                value = noise / math.sqrt(param.shape[-1])
            param.copy_(value.to(torch.bfloat16).float())


def checkpoint_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The reference state dict under the official checkpoint names (per-step weights stacked)."""
    out: dict[str, torch.Tensor] = {}
    stacked: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for name, tensor in model.state_dict().items():
        for part, target in (
            (".in_projs.", ".in_proj_weight"),
            (".out_projs.", ".out_proj.weight"),
        ):
            if part in name:
                prefix, rest = name.split(part)
                step = int(rest.split(".")[0])
                stacked.setdefault(prefix + target, []).append((step, tensor))
                break
        else:
            out[name] = tensor
    for name, parts in stacked.items():
        out[name] = torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])], dim=0)
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


class LogitRecorder:
    """Wraps the reference ``sample_token`` to keep every logit row it is asked to decide on.

    Per frame ``LMGen`` calls it once for text, then once per depth step.
    """

    def __init__(self, sample_token: Callable[..., torch.Tensor]) -> None:
        self._sample_token = sample_token
        self.rows: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.rows.append(logits.float().reshape(-1, logits.shape[-1])[0].clone())
        return self._sample_token(logits, *args, **kwargs)

    def take(self, frames: int, dep_q: int) -> tuple[np.ndarray, np.ndarray, float]:
        """``text [T, text_card]``, ``depth [T, dep_q, card]`` logits and the smallest top-2 gap."""
        rows, self.rows = self.rows, []
        assert len(rows) == frames * (1 + dep_q), len(rows)
        text = torch.stack(rows[:: 1 + dep_q])
        depth = torch.stack(
            [torch.stack(rows[i + 1 : i + 1 + dep_q]) for i in range(0, len(rows), 1 + dep_q)]
        )
        gaps = [float(r.topk(2).values[0] - r.topk(2).values[1]) for r in rows]
        return text.numpy(), depth.numpy(), min(gaps)


def run_reference(
    model: torch.nn.Module, codes: torch.Tensor, recorder: LogitRecorder
) -> tuple[dict[str, np.ndarray], float]:
    """One greedy ``LMGen`` session (batch 1) over ``codes [T, user_q]``; arrays and margin."""
    from moshi.models.lm import LMGen

    sampled_text: list[int] = []
    sampled_audio: list[list[int]] = []
    gen = LMGen(
        model,
        use_sampling=False,
        check=True,
        on_text_hook=lambda t: sampled_text.append(int(t[0])),
        on_audio_hook=lambda a: sampled_audio.append(a[0].tolist()),
    )
    dep_q = model.dep_q
    text, audio, returned = [], [], []
    with gen.streaming(1):
        for frame in codes:
            out = gen.step(frame[None, :, None])
            returned.append(out is not None)
            tokens = [-2] * (dep_q + 1) if out is None else out[0, :, 0].tolist()
            text.append(tokens[0])
            audio.append(tokens[1:])
    text_logits, depth_logits, margin = recorder.take(len(codes), dep_q)
    arrays = {
        "text": np.asarray(text, dtype=np.int64),
        "audio": np.asarray(audio, dtype=np.int64),
        "returned": np.asarray(returned, dtype=bool),
        "sampled_text": np.asarray(sampled_text, dtype=np.int64),
        "sampled_audio": np.asarray(sampled_audio, dtype=np.int64),
        "text_logits": text_logits,
        "depth_logits": depth_logits,
    }
    return arrays, margin


def main(argv: list[str] | None = None) -> int:
    """Build, save and trace the reference model; write the fixture into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--frames", type=int, default=80)
    parser.add_argument(
        "--seed", type=int, default=3, help="weight seed (3: widest greedy margin of 0..6)"
    )
    args = parser.parse_args(argv)

    import moshi.models.lm as reference_lm
    from moshi.models.lm import LMModel

    version = importlib.metadata.version("moshi")
    if version != REFERENCE_VERSION:
        print(f"warning: moshi {version}, fixture expects {REFERENCE_VERSION}", file=sys.stderr)
    config = moshi_preset(args.preset)
    try:
        kwargs = reference_kwargs(config)
    except UnsupportedByReference as error:
        print(f"{args.preset}: not modelled by moshi {version}: {error}", file=sys.stderr)
        return 2

    torch.manual_seed(args.seed)  # LMModel's own init (overwritten below) draws from it
    built = LMModel(**kwargs).eval()
    _check_shapes(built, config)
    random_weights(built, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    weights_path = args.out / "lm.safetensors"
    save_file(checkpoint_tensors(built), str(weights_path))

    model = LMModel(**kwargs).eval()  # fresh, filled only from the file
    model.load_state_dict(
        {k: v.float() for k, v in load_file(str(weights_path)).items()}, strict=True
    )
    for (name, mine), theirs in zip(
        built.state_dict().items(), model.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs), name

    recorder = LogitRecorder(reference_lm.sample_token)
    reference_lm.sample_token = recorder
    margins: list[float] = []
    trace: dict[str, np.ndarray] = {}
    for session, code_seed in SESSIONS.items():
        generator = torch.Generator().manual_seed(code_seed)
        codes = torch.randint(0, config.card, (args.frames, config.user_q), generator=generator)
        trace[f"user_codes_{session}"] = codes.numpy()
        arrays, margin = run_reference(model, codes, recorder)
        margins.append(margin)
        trace.update({f"{key}_{session}": value for key, value in arrays.items()})
    np.savez_compressed(args.out / "trace.npz", **trace)

    meta = {
        "preset": config.name,
        "frames": args.frames,
        "weight_seed": args.seed,
        "user_code_seeds": SESSIONS,
        "moshi_version": version,
        "torch_version": torch.__version__,
        "reference_kwargs": kwargs,
        "weights_dtype": "bfloat16 (run in float32)",
        "min_greedy_margin": min(margins),
        "greedy_choices_per_session": args.frames * (1 + config.dep_q),
        "warmup_frames_returning_none": int((~trace["returned_a"]).sum()),
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    distinct = {int(t) for s in SESSIONS for t in trace[f"sampled_text_{s}"]}
    print(
        f"wrote {args.out}: {args.frames} frames x {len(SESSIONS)} sessions, "
        f"{len(distinct)} distinct text tokens, min greedy margin {min(margins):.3g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
