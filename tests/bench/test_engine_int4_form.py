"""`bench/duplex_engine.py --int4-form`: the int4 ring kernel's switches, made its defaults
for one run, recorded in the run's JSON; an unknown name is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "duplex_engine.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_an_unknown_switch_is_refused() -> None:
    done = _run("--int4-form", "lazy,bogus")
    assert done.returncode == 2
    assert "bad --int4-form ['bogus']" in done.stderr


def test_the_switches_are_the_runs_defaults_and_on_record(tmp_path: Path) -> None:
    out = tmp_path / "engine"
    done = _run(
        "--phases", "ours-int4", "--batches", "2", "--steps", "1", "--warmup", "1",
        "--int4-form", "kw,lazy,vraw", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["params"]["int4_form"] == ["kw", "lazy", "vraw"]
    assert report["phases"]["ours-int4"]["per_batch"]["2"], report["phases"]
