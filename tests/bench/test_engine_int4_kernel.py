"""`bench/duplex_engine.py --int4-kernel`: the int4 ring kernel's tiling and switches, made
its module defaults for one run (read at each call), recorded in the run's JSON; a bad name
is refused."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from duplex.kernels import kv_int4, triton_available

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "duplex_engine.py"


def _load_tiling() -> ModuleType:
    """bench/_tiling.py by its path: bench/ is never put on sys.path here, where its
    ``kernels.py`` would shadow the ``kernels`` package transformers imports."""
    spec = importlib.util.spec_from_file_location("bench_tiling", ROOT / "bench" / "_tiling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TILING = _load_tiling()
tiling, int4_defaults = _TILING.tiling, _TILING.int4_defaults


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_names_parse_to_kernel_arguments_and_bad_ones_are_refused() -> None:
    assert tiling("1024/128/4/dot/s2/r0/kw/dp4a/vsub/rm/wt") == {
        "split_rows": 1024, "block_rows": 128, "num_warps": 4, "dot": True, "num_stages": 2,
        "max_registers": 0, "key_words": True, "key_dp4a": True, "value_subnormals": True,
        "row_mix": True, "whole_tiles": True,
    }  # fmt: skip
    arguments = _TILING.int4_arguments("512/64/4/dot")  # a switch not named: off
    switches = ("key_words", "key_dp4a", "value_subnormals", "row_mix", "whole_tiles")
    assert not any(arguments[switch] for switch in switches)
    assert int4_defaults("512/64/4/dot/kw") == {
        "SPLIT_ROWS": 512, "BLOCK_ROWS": 64, "NUM_WARPS": 4, "KEY_WORDS": True,
        "KEY_DP4A": False, "VALUE_SUBNORMALS": False, "ROW_MIX": False, "WHOLE_TILES": False,
    }  # fmt: skip
    # lazy and vraw: switches deleted after timing
    for bad in ("512/64", "512/x/4", "512/64/4/dot/lazy", "512/64/4/vraw", "512/64/4/rfew"):
        with pytest.raises(ValueError, match="bad tiling"):
            tiling(bad)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_the_module_defaults_are_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that sets `kv_int4.SPLIT_ROWS` reaches calls that name no tiling (the engine's)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    q = torch.zeros(1, 1, 64, device=device)
    ring = kv_int4.quantize_int4(torch.zeros(1, 1, 128, 64, device=device))
    lengths = torch.tensor([1], device=device)
    monkeypatch.setattr(kv_int4, "SPLIT_ROWS", 100)  # no multiple of BLOCK_ROWS
    with pytest.raises(ValueError, match="multiple of block_rows"):
        kv_int4.ring_attention_int4(q, ring, ring, lengths)
    monkeypatch.setattr(kv_int4, "SPLIT_ROWS", kv_int4.BLOCK_ROWS)
    out = kv_int4.ring_attention_int4(q, ring, ring, lengths)
    assert out.shape == q.shape and bool(torch.isfinite(out).all())


def test_a_bad_kernel_name_is_refused() -> None:
    done = _run("--int4-kernel", "512/64/4/dot/bogus")
    assert done.returncode == 2
    assert "--int4-kernel: bad tiling '512/64/4/dot/bogus'" in done.stderr


def test_the_kernel_is_the_runs_default_and_on_record(tmp_path: Path) -> None:
    """What the run records (on the CPU the engine reads its int4 rings by the reference, so
    the kernel's side is `test_the_module_defaults_are_read_at_each_call`'s)."""
    out = tmp_path / "engine"
    done = _run(
        "--phases", "ours-int4", "--batches", "2", "--steps", "1", "--warmup", "1",
        "--int4-kernel", "512/128/4/dot/r128", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["params"]["int4_kernel"] == "512/128/4/dot/r128"
    assert report["params"]["int4_defaults"]["BLOCK_ROWS"] == 128
    assert report["params"]["int4_defaults"]["KEY_WORDS"] is False
    assert report["params"]["int4_defaults"]["KEY_DP4A"] is False
    assert report["params"]["int4_defaults"]["VALUE_SUBNORMALS"] is False
    assert report["phases"]["ours-int4"]["per_batch"]["2"], report["phases"]
