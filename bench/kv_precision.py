"""Accuracy cost of storing the temporal KV ring in bf16, fp8 (e4m3) or int4 instead of float32.

    .venv/bin/python bench/kv_precision.py [--preset tiny] [--frames 200] [--seeds 3]
    PYTHONPATH=$PWD python3 bench/kv_precision.py --device cuda --preset moshi-7b
    .venv/bin/python bench/kv_precision.py --fp8-weights   # and the weights in fp8

With ``--fp8-weights`` a second copy of the LM holds its temporal transformer's weights in
e4m3 (``--weight-dtype fp8``: `MoshiLM.temporal_to_fp8`) and steps the same columns with
the baseline's ring and with the fp8 and int4 rings: the weights' cost alone and together
with each KV storage.

One seeded random-weight LM (float32 compute) steps the same teacher-forced input
columns (random tokens, the same for every ring) through rings of each storage
dtype, so every ring sees exactly the same history and differences come from KV
storage alone, not from diverging samples. Per frame it compares the text logits
with the float32 ring's: max |diff|, KL(p32 || p) of the softmax, and whether the
argmax agrees. On CPU the model computes in float32, the baseline is the float32
ring and the reads use the reference attention. With ``--device cuda`` the model is
built on the GPU in bf16 as it is served (``--preset moshi-7b`` works), the baseline is
the bf16 ring, and the reads are the served static step's, i.e. the Triton ring
attention kernel (an fp8 ring is read at one byte an element, with the query rounded
to fp16 for the tensor cores). Random weights are not a trained model: the figures
bound the storage error on this architecture, they do not measure a conversation's
quality.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from duplex.models.moshi import INT4, KVDtype, KVRing, moshi_preset, random_lm

DTYPES: dict[str, KVDtype] = {
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "int4": INT4,
}


def run(
    preset: str, frames: int, seed: int, device: torch.device, fp8_weights: bool = False
) -> dict[str, dict[str, float]]:
    config = moshi_preset(preset)
    cuda = device.type == "cuda"

    def build() -> torch.nn.Module:
        if cuda:
            from duplex_engine import build_lm_on_device, import_ours

            return build_lm_on_device(import_ours(), config, device, torch.bfloat16, seed)
        return random_lm(config, seed)

    model = build()
    if cuda:
        dtypes = {k: v for k, v in DTYPES.items() if k != "float32"}
        base_name = "bf16"
    else:
        dtypes, base_name = DTYPES, "float32"
    runs = [(name, model, dtype) for name, dtype in dtypes.items()]
    if fp8_weights:
        quantized = build()
        quantized.temporal_to_fp8()
        for ring in (base_name, "fp8_e4m3", "int4"):
            runs.append((f"fp8_weights+{ring}", quantized, DTYPES[ring]))
    generator = torch.Generator().manual_seed(1000 + seed)
    high = torch.tensor([config.text_card, *([config.card] * config.n_q)])
    columns = (torch.rand(frames, config.num_streams, generator=generator) * high).long()
    logits: dict[str, list[torch.Tensor]] = {}
    for name, stepped, dtype in runs:
        ring = KVRing(
            num_layers=config.num_layers,
            max_slots=1,
            num_heads=config.num_heads,
            context=config.context,
            head_dim=config.head_dim,
            device=device,
            dtype=dtype,
        )
        slots = torch.zeros(1, dtype=torch.long, device=device)
        rows = []
        with torch.no_grad():
            for frame in range(frames):
                at = torch.tensor([frame], device=device)
                # CUDA: None is the served static path (the kernel); CPU: the reference
                max_len = None if cuda else min(frame + 1, config.context)
                column = columns[frame : frame + 1].to(device)
                _, text = stepped.temporal_step(column, ring, slots, at, max_len)
                rows.append(text[0].float().cpu())
        logits[name] = rows
    out: dict[str, dict[str, float]] = {}
    base = torch.stack(logits[base_name])
    for name in logits:
        if name == base_name:
            continue
        other = torch.stack(logits[name])
        p = torch.log_softmax(base, dim=-1)
        q = torch.log_softmax(other, dim=-1)
        kl = (p.exp() * (p - q)).sum(-1)
        out[name] = {
            "max_abs_logit_diff": float((other - base).abs().max()),
            "mean_abs_logit_diff": float((other - base).abs().mean()),
            "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()),
            "argmax_agreement": float((other.argmax(-1) == base.argmax(-1)).float().mean()),
            "logit_std": float(base.std()),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp8-weights", action="store_true", help="add the fp8 weights rows")
    parser.add_argument("--out", type=Path, default=Path("out/kv_precision.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    results = {
        str(seed): run(args.preset, args.frames, seed, device, args.fp8_weights)
        for seed in range(args.seeds)
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"params": vars(args) | {"out": str(args.out)}, "results": results}, indent=1)
        + "\n"
    )
    print("| seed | ring | max abs logit diff | mean abs | KL mean | KL max | argmax agree |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for seed, per in results.items():
        for name, r in per.items():
            print(
                f"| {seed} | {name} | {r['max_abs_logit_diff']:.4f} "
                f"| {r['mean_abs_logit_diff']:.4f} | {r['kl_mean']:.2e} | {r['kl_max']:.2e} "
                f"| {r['argmax_agreement']:.3f} |"
            )
    assert all(math.isfinite(r["kl_mean"]) for per in results.values() for r in per.values())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
