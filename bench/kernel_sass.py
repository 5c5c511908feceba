"""What the ring attention kernels cost an SM, counted without a GPU: each kernel form is
compiled for Hopper (sm_90) by Triton and ptxas on this machine, and the instructions of its
main loop (one tile of key rows) are counted from the SASS, by class.

Why: on an H100 the int4 kernel is bound by instruction issue, not by bytes (docs/benchmarks.md,
"int4 on tensor cores"): its time per tile follows the loop's instruction count, so a change
to the kernel can be judged here before a GPU confirms it. The figure compared is the
instructions a key row costs the SM (loop instructions x threads / rows a tile); the
arguments are specialized as the engine's pools make them (pointers and every stride but a
scale row's divisible by 16), as Triton's JIT does at run time.

    .venv/bin/python bench/kernel_sass.py --out out/kernel-sass
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import importlib  # noqa: E402

kv_int4 = importlib.import_module("duplex.kernels.kv_int4")
ring_attention = importlib.import_module("duplex.kernels.ring_attention")  # the module

HEAD_DIM, GROUP = 128, 32
TARGET = GPUTarget("cuda", 90, 32)
UNALIGNED = {"stride_ksr", "stride_vsr", "splits"}
"""Integer arguments not divisible by 16 in the 7B's pools (a row's four float16 scales)."""


def _compile(kernel: Any, pointers: dict[str, str], constants: dict[str, Any], warps: int,
             stages: int) -> Any:  # fmt: skip
    names = kernel.arg_names
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name not in UNALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs=attrs,
    )
    return triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": stages})


def main_loop(sass: str) -> list[str]:
    """The opcodes of the longest loop: a label and the last backward branch to it."""
    lines = [line.split("\t", 1)[-1].strip() for line in sass.splitlines()]
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\.?L\w+:", line)}
    best: tuple[int, int] = (0, 0)
    for i, line in enumerate(lines):
        match = re.search(r"\bBRA\s+(\.?L\w+)", line)
        if match and match.group(1) in labels and labels[match.group(1)] < i:
            start = labels[match.group(1)]
            if i - start > best[1] - best[0]:
                best = (start, i)
    body = lines[best[0] + 1 : best[1] + 1]
    ops = []
    for line in body:
        line = re.sub(r"^@!?U?P\w+\s+", "", line)
        if line and not line.endswith(":"):
            ops.append(line.split()[0].rstrip(";"))
    return ops


def count(name: str, kernel: Any, pointers: dict[str, str], constants: dict[str, Any],
          warps: int, stages: int) -> dict[str, Any]:  # fmt: skip
    compiled = _compile(kernel, pointers, constants, warps, stages)
    ops = main_loop(compiled.asm["sass"])
    threads = 32 * warps
    rows = constants["BLOCK_ROWS"]
    classes = collections.Counter(op.split(".")[0] for op in ops)
    row = {
        "kernel": name,
        "warps": warps,
        "stages": stages,
        "block_rows": rows,
        "loop_instructions": len(ops),
        "per_key_row": round(len(ops) * threads / rows, 1),
        "shared_bytes": compiled.metadata.shared,
        "classes": dict(classes.most_common()),
    }
    return row


def forms() -> list[tuple[str, Any, dict[str, str], dict[str, Any], int, int]]:
    base = {"q_ptr": "*bf16", "len_ptr": "*i64", "slot_ptr": "*i64", "part_ptr": "*fp32"}
    ring_base = {**base, "skip_ptr": "*i64"}
    out = []
    for dtype, label, size in (("*bf16", "bf16", 2), ("*fp8e4nv", "fp8", 1)):
        block = ring_attention.BLOCK_ROWS[size]
        pointers = {**ring_base, "k_ptr": dtype, "v_ptr": dtype}
        constants = {
            "SPLIT_ROWS": ring_attention.SPLIT_ROWS,
            "BLOCK_ROWS": block,
            "HEAD_DIM": HEAD_DIM,
            "DOT": True,
            "DOT_DTYPE": tl.float16 if label == "fp8" else tl.bfloat16,
            "V_WORDS": False,
            "ASM": True,
            "SKIP": False,
        }
        kernel = ring_attention._ring_attention_split
        out.append((f"{label} ring", kernel, pointers, constants, ring_attention.NUM_WARPS, 3))
        if label == "fp8":
            words = {**constants, "V_WORDS": True}
            out.append(
                ("fp8 ring, value words", kernel, pointers, words, ring_attention.NUM_WARPS, 3)
            )
    int4_pointers = {**base, "kp_ptr": "*u8", "ks_ptr": "*fp16", "vp_ptr": "*u8", "vs_ptr": "*fp16"}
    int4 = {"SPLIT_ROWS": kv_int4.SPLIT_ROWS, "HALF": HEAD_DIM // 2, "GROUP": GROUP, "ASM": True}
    int4.update(DOT_DTYPE=tl.float16, WORD_BITS=0, V_PAIRS=False)
    kernel = kv_int4._ring_attention_int4
    elementwise = {**int4, "DOT": False, "BLOCK_ROWS": 64}
    out.append(("int4 elementwise", kernel, int4_pointers, elementwise, 4, 3))
    for block, warps in ((kv_int4.BLOCK_ROWS, kv_int4.NUM_WARPS), (32, 2)):
        dot = {**int4, "DOT": True, "BLOCK_ROWS": block}
        out.append(("int4 tensor cores, scale by scale", kernel, int4_pointers, dot, warps, 3))
        words = {**dot, "WORD_BITS": 64}  # a row's four float16 scales: the default
        out.append(("int4 tensor cores", kernel, int4_pointers, words, warps, 3))
        pairs = {**words, "V_PAIRS": True}
        out.append(("int4 tensor cores, value words", kernel, int4_pointers, pairs, warps, 3))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/kernel-sass"))
    args = parser.parse_args(argv)
    rows = [count(*form) for form in forms()]
    print("| kernel | rows a tile / warps | loop instructions | a key row | shared bytes |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['kernel']} | {r['block_rows']} / {r['warps']} | {r['loop_instructions']} "
            f"| {r['per_key_row']} | {r['shared_bytes']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "command": " ".join(["python", *sys.argv]),
        "triton": triton.__version__,
        "target": "sm_90",
        "rows": rows,
    }
    args.out.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
