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
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
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
             stages: int, max_registers: int | None = None) -> Any:  # fmt: skip
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
    options = {"num_warps": warps, "num_stages": stages}
    if max_registers:
        options["maxnreg"] = max_registers
    return triton.compile(source, target=TARGET, options=options)


def _loop_span(lines: list[str]) -> tuple[int, int]:
    """The main loop's first and last line: a label and the last backward branch to it. The
    main loop is the first at least half as long as the longest: with whole tiles read
    unmasked (the int4 kernel's ``WHOLE_TILES``) a second, masked copy of the loop follows it,
    longer, which reads at most one tile a split."""
    text = [line.split("\t", 1)[-1].strip() for line in lines]
    labels = {line[:-1]: i for i, line in enumerate(text) if re.fullmatch(r"\.?L\w+:", line)}
    loops: dict[int, int] = {}
    for i, line in enumerate(text):
        match = re.search(r"\bBRA\s+(\.?L\w+)", line)
        if match and match.group(1) in labels and labels[match.group(1)] < i:
            loops[labels[match.group(1)]] = i  # the last branch back to each label
    if not loops:
        return 0, 0
    longest = max(end - start for start, end in loops.items())
    start = min(start for start, end in loops.items() if 2 * (end - start) >= longest)
    return start + 1, loops[start] + 1


def main_loop(sass: str) -> list[str]:
    """The opcodes of the longest loop."""
    lines = sass.splitlines()
    start, end = _loop_span(lines)
    ops = []
    for line in lines[start:end]:
        line = re.sub(r"^@!?U?P\w+\s+", "", line.split("\t", 1)[-1].strip())
        if line and not line.endswith(":"):
            ops.append(line.split()[0].rstrip(";"))
    return ops


def stall_cycles(sass: str) -> tuple[int, int]:
    """The stall counts ptxas wrote into the control codes (``wait:read:write:yield:stall``,
    hex) of the longest loop's instructions, and of the whole kernel's: the cycles an
    instruction holds its warp before the next issues, fixed latencies only (a wait on a
    load or a shared-memory read is not in them)."""
    lines = sass.splitlines()
    start, end = _loop_span(lines)

    def stalls(chunk: list[str]) -> int:
        codes = [line.split("\t", 1)[0].strip() for line in chunk if "\t" in line]
        return sum(int(code.rsplit(":", 1)[-1], 16) for code in codes if code.count(":") == 4)

    return stalls(lines[start:end]), stalls(lines)


def registers(ptx: str) -> tuple[int, int]:
    """Registers a thread and spilled bytes (stores + loads), by ``ptxas -v`` on the PTX."""
    ptxas = get_ptxas(TARGET.arch).path
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        report = subprocess.run(
            [ptxas, "-v", f"--gpu-name=sm_{TARGET.arch}a", str(source), "-o", str(source) + ".o"],
            capture_output=True,
            text=True,
            check=True,
        )
    text = report.stdout + report.stderr
    used = re.search(r"Used (\d+) registers", text)
    spilled = sum(int(n) for n in re.findall(r"(\d+) bytes spill", text))
    return (int(used.group(1)) if used else -1), spilled


def count(name: str, kernel: Any, pointers: dict[str, str], constants: dict[str, Any],
          warps: int, stages: int, max_registers: int | None = None) -> dict[str, Any]:  # fmt: skip
    compiled = _compile(kernel, pointers, constants, warps, stages, max_registers)
    sass = compiled.asm["sass"]
    ops = main_loop(sass)
    threads = 32 * warps
    rows = constants["BLOCK_ROWS"]
    classes = collections.Counter(op.split(".")[0] for op in ops)
    loop_stalls, kernel_stalls = stall_cycles(sass)
    regs, spilled = registers(compiled.asm["ptx"])
    row = {
        "kernel": name,
        "warps": warps,
        "stages": stages,
        "block_rows": rows,
        "loop_instructions": len(ops),
        "per_key_row": round(len(ops) * threads / rows, 1),
        "loop_stall_cycles": loop_stalls,
        "stall_cycles_per_key_row": round(loop_stalls * warps / rows, 1),
        "kernel_stall_cycles": kernel_stalls,
        "max_registers": max_registers,
        "registers": regs,
        "spilled_bytes": spilled,
        "shared_bytes": compiled.metadata.shared,
        "classes": dict(classes.most_common()),
    }
    return row


def forms() -> list[tuple[Any, ...]]:
    """(label, kernel, pointer types, constants, warps, stages[, register cap]) of each form."""
    base = {"q_ptr": "*bf16", "len_ptr": "*i64", "slot_ptr": "*i64", "part_ptr": "*fp32"}
    ring_base = {**base, "skip_ptr": "*i64", "out_ptr": "*bf16"}
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
            "SLOTS": True,
            "DIRECT": False,
        }
        kernel = ring_attention._ring_attention_split
        out.append((f"{label} ring", kernel, pointers, constants, ring_attention.NUM_WARPS, 3))
        if label == "fp8":
            words = {**constants, "V_WORDS": True}
            out.append(
                ("fp8 ring, value words", kernel, pointers, words, ring_attention.NUM_WARPS, 3)
            )
    int4_pointers = {**base, "kp_ptr": "*u8", "ks_ptr": "*fp16", "vp_ptr": "*u8", "vs_ptr": "*fp16"}
    # the tilings as first counted (512-row splits, 64-row tiles of 4 warps), so the rows of
    # bench/results/kernel-sass-sm90.json stay comparable; the default tiling is the last row
    int4 = {"SPLIT_ROWS": 512, "HALF": HEAD_DIM // 2, "GROUP": GROUP, "ASM": True}
    int4.update(DOT_DTYPE=tl.float16, WORD_BITS=0, V_PAIRS=False, K_WORDS=False, SLOTS=True)
    int4.update(K_DP4A=False, V_SUB=False, ROW_MIX=False, WHOLE_TILES=False)
    kernel = kv_int4._ring_attention_int4
    elementwise = {**int4, "DOT": False, "BLOCK_ROWS": 64}
    out.append(("int4 elementwise", kernel, int4_pointers, elementwise, 4, 3))
    for block, warps in ((64, 4), (32, 2)):
        dot = {**int4, "DOT": True, "BLOCK_ROWS": block}
        out.append(("int4 tensor cores, scale by scale", kernel, int4_pointers, dot, warps, 3))
        words = {**dot, "WORD_BITS": 64}  # a row's four float16 scales: the default
        out.append(("int4 tensor cores", kernel, int4_pointers, words, warps, 3))
        pairs = {**words, "V_PAIRS": True}
        out.append(("int4 tensor cores, value words", kernel, int4_pointers, pairs, warps, 3))
    pairs = {**int4, "DOT": True, "BLOCK_ROWS": 64, "WORD_BITS": 64}
    pairs["V_PAIRS"] = True
    for stages in (4, 5):  # more tiles loading ahead: registers and shared memory they take
        label = f"int4 tensor cores, value words, {stages} stages"
        out.append((label, kernel, int4_pointers, pairs, 4, stages))
    # at 96 registers a thread (111 uncapped) an SM holds 5 programs of 4 warps, not 4
    for stages in (3, 4, 5):
        label = f"int4 tensor cores, value words, {stages} stages, 96 registers"
        out.append((label, kernel, int4_pointers, pairs, 4, stages, 96))
    words = {**pairs, "K_WORDS": True}
    out.append(("int4, key and value words, 96 registers", kernel, int4_pointers, words, 4, 3, 96))
    tiles = (kv_int4.NUM_WARPS, kv_int4.NUM_STAGES, kv_int4.MAX_REGISTERS)
    shipped = {**words, "BLOCK_ROWS": kv_int4.BLOCK_ROWS, "SPLIT_ROWS": kv_int4.SPLIT_ROWS}
    rows = f"{kv_int4.SPLIT_ROWS}/{kv_int4.BLOCK_ROWS} rows, {kv_int4.MAX_REGISTERS} registers"
    out.append((f"int4, key and value words, {rows}", kernel, int4_pointers, shipped, *tiles))
    dp4a = {**shipped, "K_WORDS": False, "K_DP4A": True}
    out.append((f"int4, keys by dp4a, value words, {rows}", kernel, int4_pointers, dp4a, *tiles))
    for label, switches in (
        ("value subnormals", {"V_SUB": True}),
        ("row mix", {"ROW_MIX": True}),
        ("row mix, value subnormals", {"ROW_MIX": True, "V_SUB": True}),
    ):
        form = (f"int4, keys by dp4a, {label}, {rows}", kernel, int4_pointers)
        out.append((*form, {**dp4a, **switches}, *tiles))
    label = f"int4, keys by dp4a, row mix, value subnormals, whole tiles unmasked, {rows}"
    unmasked = {**dp4a, "ROW_MIX": True, "V_SUB": True, "WHOLE_TILES": True}
    out.append((label, kernel, int4_pointers, unmasked, *tiles))
    default = {**shipped, "K_WORDS": not kv_int4.KEY_DP4A, "K_DP4A": kv_int4.KEY_DP4A}
    default["V_SUB"] = kv_int4.VALUE_SUBNORMALS
    default["ROW_MIX"] = kv_int4.KEY_DP4A and kv_int4.ROW_MIX
    default["WHOLE_TILES"] = kv_int4.WHOLE_TILES
    out.append((f"int4, {rows} (the default)", kernel, int4_pointers, default, *tiles))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/kernel-sass"))
    args = parser.parse_args(argv)
    rows = [count(*form) for form in forms()]
    print(
        "| kernel | rows a tile / warps | loop instructions | a key row | stall cycles a key "
        "row | registers | shared bytes |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['kernel']} | {r['block_rows']} / {r['warps']} | {r['loop_instructions']} "
            f"| {r['per_key_row']} | {r['stall_cycles_per_key_row']} | {r['registers']} "
            f"| {r['shared_bytes']} |"
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
