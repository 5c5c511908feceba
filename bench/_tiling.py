"""A ring kernel's tiling by name, shared by the kernel benches and `duplex_engine.py`.

``split/block/warps[/dot][/sN][/rN][/kw][/dp4a][/vsub][/rm][/wt]``: split rows, block rows,
warps, on tensor cores, N software-pipeline stages, at most N registers a thread (``r0``:
uncapped), keys read as 16-bit words on tensor cores, keys' products as 8-bit integer dot
products, values' nibbles as float16 subnormals, the values' weights computed a row at a
time (``rm``, with ``dp4a``), whole tiles read without masks (``wt``) (the last seven for the
int4 kernel only; a switch not named is off; ``dp4a`` takes precedence over ``kw``).
Result files of 2026-12-06 and before also name ``/lazy`` (the accumulators rescaled only when
the max moved past a margin: no faster) and ``/vraw`` (value nibbles left with their offsets:
0.98x the time, 2.5-5x the error), both deleted.
Those before the value words became the kernels' only form name ``/v``: those words, timed
against bytes."""

from __future__ import annotations

from typing import Any

INT4_DEFAULTS = {
    "split_rows": "SPLIT_ROWS",
    "block_rows": "BLOCK_ROWS",
    "num_warps": "NUM_WARPS",
    "num_stages": "NUM_STAGES",
    "max_registers": "MAX_REGISTERS",
    "key_words": "KEY_WORDS",
    "key_dp4a": "KEY_DP4A",
    "value_subnormals": "VALUE_SUBNORMALS",
    "row_mix": "ROW_MIX",
    "whole_tiles": "WHOLE_TILES",
}
"""Each int4 kernel argument's module default in `duplex.kernels.kv_int4` (read at each call)."""


def tiling(name: str) -> dict[str, Any]:
    """A tiling's kernel arguments from its name (the module docstring); ValueError if bad."""
    try:
        split_rows, block_rows, warps, *flags = name.split("/")
        out: dict[str, Any] = {
            "split_rows": int(split_rows),
            "block_rows": int(block_rows),
            "num_warps": int(warps),
            "dot": "dot" in flags,
        }
        for flag in flags:
            if flag == "kw":
                out["key_words"] = True
            elif flag == "dp4a":
                out["key_dp4a"] = True
            elif flag == "vsub":
                out["value_subnormals"] = True
            elif flag == "rm":
                out["row_mix"] = True
            elif flag == "wt":
                out["whole_tiles"] = True
            elif flag.startswith("s"):
                out["num_stages"] = int(flag[1:])
            elif flag.startswith("r"):
                out["max_registers"] = int(flag[1:])
            elif flag != "dot":
                raise ValueError(f"unknown flag {flag!r}")
    except ValueError as error:
        raise ValueError(
            f"bad tiling {name!r} ({error}): "
            "split/block/warps[/dot][/sN][/rN][/kw][/dp4a][/vsub][/rm][/wt]"
        ) from None
    return out


def int4_arguments(name: str) -> dict[str, Any]:
    """`tiling` as `ring_attention_int4`'s arguments: a switch the name leaves out is off (the
    kernel's own default would turn it on), stages and registers it leaves out are the
    module's."""
    switches = ("key_words", "key_dp4a", "value_subnormals", "row_mix", "whole_tiles")
    return {**dict.fromkeys(switches, False), **tiling(name)}


def int4_defaults(name: str) -> dict[str, Any]:
    """`int4_arguments` as `duplex.kernels.kv_int4`'s module defaults (the kernel benches'
    reading of a name, for a whole run). ``dot`` is not a default (the kernel takes tensor
    cores where they fit)."""
    arguments = int4_arguments(name)
    return {INT4_DEFAULTS[arg]: value for arg, value in arguments.items() if arg in INT4_DEFAULTS}
